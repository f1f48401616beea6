"""Translating with CTranslate2, the C++ inference engine, behind the :class:`Translator`.

``Translator.from_run(RUN, engine="ctranslate2", quantization="int8")`` uses the model
exported into ``RUN/ctranslate2-int8`` (exported there on first use, see
:mod:`attnmt.export`), or the run folder itself when it is an export (``attnmt export``
writes ``model.bin`` beside ``config.yaml`` and the tokenizers). Tokenizing, batching by
source tokens, beam, alpha, n-best, length limits and empty inputs are the translator's
and the same as with the PyTorch engine. What the engine cannot do the same way:

* its length penalty is ``log P / length ** alpha``, not GNMT's
  ``((5 + length) / 6) ** alpha`` (greedy search is unaffected);
* it returns the attention of the last layer averaged over heads, without the step
  that emits EOS (that row is zeros; the EOS column is what the other columns leave);
* it has no self-attention maps and no sampling with per-sentence seeds.
"""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

import torch

from attnmt.config import Config
from attnmt.errors import UserError
from attnmt.export import QUANTIZATIONS, check_exportable, export_run, require_ctranslate2
from attnmt.model import build_model
from attnmt.run import RunDirectory, say
from attnmt.search import Hypothesis


BATCH_SENTENCES = 64                      # the engine's own batches (its threads take one each)


class CTranslate2Engine:
    name = "ctranslate2"

    def __init__(self, engine, config: Config, source_tokenizer, target_tokenizer, quantization: str):
        self.engine = engine
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        with torch.device("meta"):                 # the shape of the model, no memory
            model = build_model(config.model, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        self.parameters = model.num_parameters()
        self.description = f"{model.description} (CTranslate2, {quantization})"
        self.attention_grid = (1, 1)                # last layer, heads averaged
        self.has_self_attention = False
        self.max_source_tokens = model.max_source_tokens
        self.target_ids = {target_tokenizer.id_to_piece(i): i for i in range(target_tokenizer.vocab_size)}

    @classmethod
    def from_run(cls, run: RunDirectory, config: Config, source_tokenizer, target_tokenizer,
                 quantization: str, checkpoint: str, device: torch.device) -> "CTranslate2Engine":
        ctranslate2 = require_ctranslate2()
        if quantization not in QUANTIZATIONS:
            raise UserError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
        supported = ctranslate2.get_supported_compute_types(device.type)
        if quantization not in supported:
            raise UserError(f"CTranslate2 cannot run {quantization} on this {device.type}; it can run "
                            f"{', '.join(sorted(supported))}")
        folder = run.path if (run.path / "model.bin").is_file() else exported_folder(run.path, quantization)
        if not (folder / "model.bin").is_file():
            with torch.device("meta"):
                check_exportable(build_model(config.model, source_tokenizer.vocab_size,
                                             target_tokenizer.vocab_size), run.path)
            say(f"exporting {run.path} for CTranslate2 ({quantization}) into {folder}")
            export_run(run.path, folder, quantization, checkpoint)
        # Batches in parallel, one thread each: measured faster on 2 cores than two threads
        # per batch (docs/performance.md).
        engine = ctranslate2.Translator(str(folder), device=device.type, compute_type=quantization,
                                        inter_threads=torch.get_num_threads(), intra_threads=1)
        return cls(engine, config, source_tokenizer, target_tokenizer, quantization)

    def num_parameters(self) -> int:
        return self.parameters

    def search(self, sources: list[list[int]], options) -> list[list[Hypothesis]]:
        """``options.n_best`` hypotheses per source, sentences of one length limit together
        (the engine takes one maximum length per call)."""
        if options.sampling is not None:
            raise UserError("sampling runs on the PyTorch engine only (--engine torch): its "
                            "samples are repeatable per sentence, the C++ engine's are not")
        limits = [max(1, int(len(ids) * options.max_len_a + options.max_len_b)) for ids in sources]
        order = sorted(range(len(sources)), key=lambda i: limits[i])
        results: list[list[Hypothesis]] = [[] for _ in sources]
        submitted = []
        for limit, group in groupby(order, key=lambda i: limits[i]):
            group = list(group)
            pieces = [[self.source_tokenizer.id_to_piece(i) for i in sources[index]] for index in group]
            if limit == 1:                 # only EOS fits; the engine decodes at least a token
                scores = self.engine.score_batch(pieces, [[]] * len(group), max_batch_size=BATCH_SENTENCES)
                for index, scored in zip(group, scores):
                    log_prob = sum(scored.log_probs)                  # log P(EOS | source)
                    results[index] = [Hypothesis([], log_prob, log_prob)]
                continue
            pending = self.engine.translate_batch(          # queued: the engine's threads share them
                pieces, max_batch_size=BATCH_SENTENCES, asynchronous=True,
                beam_size=options.beam, num_hypotheses=options.n_best,
                length_penalty=options.alpha if options.beam > 1 else 0.0,
                max_decoding_length=limit - 1, min_decoding_length=min(options.min_len, limit - 1),
                return_scores=True, return_attention=options.need_attention)
            submitted += zip(group, pending)
        for index, pending in submitted:
            result = pending.result()
            results[index] = [self._hypothesis(result, k, options, len(sources[index]))
                              for k in range(len(result.hypotheses))]
        return results

    def _hypothesis(self, result, k: int, options, source_length: int) -> Hypothesis:
        tokens = [self.target_ids[piece] for piece in result.hypotheses[k]]
        score = result.scores[k]
        alpha = options.alpha if options.beam > 1 else 0.0
        attention = None
        if options.need_attention:
            attention = _full_attention(torch.tensor(result.attention[k]), len(tokens), source_length)
        return Hypothesis(tokens, score, score * (len(tokens) + 1) ** alpha, attention)


def exported_folder(run: Path, quantization: str) -> Path:
    return Path(run) / f"ctranslate2-{quantization}"


def _full_attention(rows: torch.Tensor, tokens: int, source_length: int) -> torch.Tensor:
    """The engine's ``(T, S)`` rows (no EOS step, no EOS column) as ``(T+1, 1, 1, S+1)``:
    the EOS column holds what the row leaves (rows sum to 1), the EOS step is zeros."""
    full = torch.zeros(tokens + 1, source_length + 1)
    if tokens:
        rows = rows.reshape(tokens, source_length)
        full[:tokens, :source_length] = rows
        full[:tokens, source_length] = (1.0 - rows.sum(dim=1)).clamp_min(0.0)
    return full[:, None, None, :]
