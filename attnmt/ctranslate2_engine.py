"""Translating with CTranslate2, the C++ inference engine, behind the :class:`Translator`.

``Translator.from_run(RUN, engine="ctranslate2", quantization="int8")`` uses the model
exported into ``RUN/ctranslate2-int8`` (exported there on first use, and again when the
run's weights have changed, see :mod:`attnmt.export`), or the run folder itself when it is
an export (``attnmt export`` writes ``model.bin`` beside ``config.yaml`` and the
tokenizers). Tokenizing, batching by source tokens, beam, alpha, n-best, length limits and
empty inputs are the translator's and the same as with the PyTorch engine. What the engine
cannot do the same way:

* its length penalty is ``log P / length ** alpha``, not GNMT's
  ``((5 + length) / 6) ** alpha`` (greedy search is unaffected);
* it returns the attention of the last layer averaged over heads, without the step
  that emits EOS (that row is zeros; the EOS column is what the other columns leave);
* it has no self-attention maps and no sampling with per-sentence seeds.

Nothing here imports PyTorch: a folder written by ``attnmt export`` translates where
only CTranslate2, SentencePiece and NumPy are installed. Only exporting a run on first
use needs PyTorch.
"""

from __future__ import annotations

import json
import os
from itertools import groupby
from pathlib import Path

import numpy as np

from attnmt.config import Config
from attnmt.decoding import Hypothesis
from attnmt.errors import UserError

QUANTIZATIONS = ("int8", "int8_float32", "bfloat16", "float32")
EXPORT_INFO = "export.json"               # written by attnmt export: what the model is
BATCH_SENTENCES = 64                      # the engine's own batches (its threads take one each)


def require_ctranslate2():
    """The ``ctranslate2`` module, or a one-line error naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise UserError("CTranslate2 is not installed; install the extra: "
                        "pip install -e \".[ct2]\" (or pip install ctranslate2)") from None
    return ctranslate2


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class CTranslate2Engine:
    name = "ctranslate2"

    def __init__(self, engine, config: Config, source_tokenizer, target_tokenizer, quantization: str,
                 parameters: int | None, never_output: list[str] = ()):
        self.engine = engine
        self.parallel_batches = engine.num_translators        # batches decoded at once
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        model = config.model
        self.parameters = parameters
        self.description = (f"Transformer, {model.encoder_layers}+{model.decoder_layers} layers, "
                            f"{model.heads} heads (CTranslate2, {quantization})")
        self.attention_grid = (1, 1)                # last layer, heads averaged
        self.has_self_attention = False
        self.max_source_tokens = model.max_positions - 1          # EOS takes one position
        self.max_output_tokens = model.max_positions              # EOS included
        self.target_ids = {target_tokenizer.id_to_piece(i): i for i in range(target_tokenizer.vocab_size)}
        # Tokens the export keeps but the model never outputs (attnmt.export.never_output).
        self.suppressed = [[token] for token in never_output] or None

    @classmethod
    def from_run(cls, path: Path, config: Config, source_tokenizer, target_tokenizer,
                 quantization: str | None, checkpoint: str, device: str, threads: int = 0
                 ) -> "CTranslate2Engine":
        """The engine of an exported folder, or of a run (exported into
        ``RUN/ctranslate2-QUANTIZATION`` on first use, which needs PyTorch). ``quantization``
        None: an export runs with the weight type it was written in, a run with int8."""
        ctranslate2 = require_ctranslate2()
        exported = (path / "model.bin").is_file()
        if quantization is None:
            quantization = _export_info(path).get("quantization", "int8") if exported else "int8"
            if quantization not in QUANTIZATIONS:
                raise UserError(f"{path / EXPORT_INFO} names the weight type {quantization!r}, which "
                                f"attnmt does not know ({', '.join(QUANTIZATIONS)}); export the run "
                                "again, or choose one with --quantization")
        if quantization not in QUANTIZATIONS:
            raise UserError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {quantization!r}")
        device = _device(device, ctranslate2)
        supported = ctranslate2.get_supported_compute_types(device)
        if quantization not in supported:
            raise UserError(f"CTranslate2 cannot run {quantization} on this {device}; it can run "
                            f"{', '.join(sorted(supported))}")
        if config.model.arch != "transformer":
            raise UserError(f"{path} holds an RNN; CTranslate2 runs Transformers only (it has no RNN "
                            "decoders): translate it with --engine torch")
        folder = path
        if not exported:
            folder = exported_folder(path, quantization)
            _export_unless_current(path, folder, quantization, checkpoint)
        # Batches in parallel, one thread each: measured faster on 2 cores than two threads
        # per batch (records/performance.md).
        try:
            engine = ctranslate2.Translator(str(folder), device=device, compute_type=quantization,
                                            inter_threads=threads or cpu_cores(), intra_threads=1)
        except RuntimeError as error:              # a truncated or foreign model.bin
            raise UserError(f"{folder / 'model.bin'} is not a CTranslate2 model CTranslate2 can "
                            f"load ({error})") from None
        info = _export_info(folder)
        return cls(engine, config, source_tokenizer, target_tokenizer, quantization,
                   info.get("parameters"), info.get("never_output", []))

    def num_parameters(self) -> int:
        return self.parameters

    def search(self, sources: list[list[int]], options, prefixes: list[list[int]] | None = None,
               traces: None = None) -> list[list[Hypothesis]]:
        """``options.n_best`` hypotheses per source, sentences of one length limit together
        (the engine takes one maximum length per call); ``prefixes``: the output tokens each
        must start with (the engine's ``target_prefix``; its scores then count only the
        tokens after them). It has no search steps to trace."""
        if options.sampling is not None:
            raise UserError("sampling runs on the PyTorch engine only (--engine torch): its "
                            "samples are repeatable per sentence, the C++ engine's are not")
        limits = [options.output_limit(len(ids)) for ids in sources]
        order = sorted(range(len(sources)), key=lambda i: limits[i])
        results: list[list[Hypothesis]] = [[] for _ in sources]
        submitted = []
        for limit, group in groupby(order, key=lambda i: limits[i]):
            group = list(group)
            pieces = [[self.source_tokenizer.id_to_piece(i) for i in sources[index]] for index in group]
            forced = None if prefixes is None else \
                [[self.target_tokenizer.id_to_piece(i) for i in prefixes[index]] for index in group]
            if limit == 1:      # only EOS fits, forced at the limit and free, as in search.py
                for index in group:
                    results[index] = [Hypothesis([], 0.0, 0.0)]
                continue
            pending = self.engine.translate_batch(          # queued: the engine's threads share them
                pieces, max_batch_size=BATCH_SENTENCES, asynchronous=True,
                beam_size=options.beam, num_hypotheses=options.n_best,
                length_penalty=options.alpha if options.beam > 1 else 0.0,
                max_decoding_length=limit - 1, min_decoding_length=min(options.min_len, limit - 1),
                return_scores=True, return_attention=options.need_attention, target_prefix=forced,
                suppress_sequences=self.suppressed)
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
            attention = _full_attention(np.asarray(result.attention[k], dtype=np.float32),
                                        len(tokens), source_length)
        return Hypothesis(tokens, score, score * (len(tokens) + 1) ** alpha, attention)


def exported_folder(run: Path, quantization: str) -> Path:
    return Path(run) / f"ctranslate2-{quantization}"


def _device(device: str, ctranslate2) -> str:
    if device not in ("cpu", "cuda", "auto"):
        raise UserError(f"device must be one of cpu, cuda, auto; got {device!r}")
    gpus = ctranslate2.get_cuda_device_count()
    if device == "cuda" and not gpus:
        raise UserError("device: cuda requested but no CUDA device is available")
    return "cuda" if device == "auto" and gpus else "cpu" if device == "auto" else device


def _export_unless_current(run: Path, folder: Path, quantization: str, checkpoint: str) -> None:
    """Export ``run``'s weights of ``checkpoint`` into ``folder`` unless the export there was
    made from these very weights (training on, averaging or another --checkpoint change them:
    an export kept from before would translate with the old ones), or the run has no weights
    file to compare (a run folder copied with its export only)."""
    from attnmt.run import RunDirectory, say

    digest = RunDirectory(run).weights_digest(checkpoint)
    earlier = (folder / "model.bin").is_file()
    if earlier and digest in ("", _export_info(folder).get("weights_sha256")):
        return
    try:
        from attnmt.export import export_run
    except ImportError:
        raise UserError(f"{run} is a training run, and exporting it for CTranslate2 needs PyTorch; "
                        f"export it where attnmt trains (attnmt export {run} OUT) and translate "
                        "OUT here") from None
    say(f"exporting {run} for CTranslate2 ({quantization}) into {folder}"
        + (" again: the run's weights changed since its last export" if earlier else ""))
    export_run(run, folder, quantization, checkpoint, force=earlier)


def _export_info(folder: Path) -> dict:
    """``export.json`` of an export (absent from exports made before it existed: {})."""
    try:
        info = json.loads((folder / EXPORT_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _full_attention(rows: np.ndarray, tokens: int, source_length: int) -> np.ndarray:
    """The engine's ``(T, S)`` rows (no EOS step, no EOS column) as ``(T+1, 1, 1, S+1)``:
    the EOS column holds what the row leaves (rows sum to 1), the EOS step is zeros."""
    full = np.zeros((tokens + 1, source_length + 1), dtype=np.float32)
    if tokens:
        rows = rows.reshape(tokens, source_length)
        full[:tokens, :source_length] = rows
        full[:tokens, source_length] = np.clip(1.0 - rows.sum(axis=1), 0.0, None)
    return full[:, None, None, :]
