"""``Translator``: load a run directory and translate raw text.

The one path that the command line, plots, experiments and the server share::

    translator = Translator.from_run("runs/multi30k_de_en_transformer")
    for translation in translator.translate(["Ein Hund läuft."], beam=5, n_best=2):
        print(translation.best.text, translation.best.score)

Loading a model changes nothing in the process (threads, allocator): the commands
choose those with :func:`attnmt.process.configure`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from attnmt.checkpoint import load_weights
from attnmt.config import Config, load_config
from attnmt.data import BOS_ID
from attnmt.data.batching import source_batches, source_tensor
from attnmt.data.tokenizers import load_tokenizers
from attnmt.errors import UserError
from attnmt.model import Seq2Seq, build_model
from attnmt.process import resolve_device, resolve_precision
from attnmt.run import RunDirectory
from attnmt.search import Hypothesis, Sampling, beam_search, greedy_search, sample_search


@dataclass
class TranslatedHypothesis:
    text: str                         # detokenised output
    score: float                      # search score (length-normalised log-probability in beam)
    log_prob: float
    tokens: list[str]                 # output pieces, without EOS
    ids: list[int]
    attention: torch.Tensor | None    # (output tokens + EOS, layers, heads, source tokens + EOS)


@dataclass
class Translation:
    source: str
    source_tokens: list[str]          # source pieces, without EOS
    hypotheses: list[TranslatedHypothesis]

    @property
    def best(self) -> TranslatedHypothesis:
        return self.hypotheses[0]


class Translator:
    def __init__(self, model: Seq2Seq, source_tokenizer, target_tokenizer, config: Config,
                 autocast_dtype: torch.dtype | None = None):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.config = config
        self.autocast_dtype = autocast_dtype

    @classmethod
    def from_run(cls, path: str | Path, checkpoint: str = "best", precision: str = "fp32",
                 device: str = "cpu") -> "Translator":
        """Load ``config.yaml``, the tokenizers and ``<checkpoint>.safetensors`` of a run.

        ``checkpoint`` is ``best`` (falls back to ``last``), ``last``, or a file path.
        ``precision``: ``fp32``, ``bf16`` or ``auto`` (bf16 autocast where the hardware runs
        it natively, see :func:`attnmt.process.resolve_precision`). ``device``: ``cpu``,
        ``cuda`` or ``auto``.
        """
        run = RunDirectory(path)
        if not run.config.is_file():
            raise UserError(f"{run.path} is not an attnmt run directory (no config.yaml)")
        target = resolve_device(device, setting="device")
        autocast_dtype = resolve_precision(precision, target, setting="precision")
        config = load_config(run.config)
        source_tokenizer, target_tokenizer = load_tokenizers(run.path)
        model = build_model(config.model, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        load_weights(model, run.weights(checkpoint))
        return cls(model.to(target), source_tokenizer, target_tokenizer, config, autocast_dtype)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def translate(self, texts: list[str], beam: int | None = None, n_best: int = 1,
                  alpha: float | None = None, batch_tokens: int | None = None,
                  need_attention: bool = False,
                  sampling: Sampling | None = None) -> list[Translation]:
        """Translate raw texts; results come in input order, ``n_best`` hypotheses each.

        With ``sampling``, the ``n_best`` hypotheses are samples (``beam`` is not used).
        Empty (or whitespace-only) texts get one empty hypothesis. A text longer than the
        model accepts raises :class:`UserError` naming it.
        """
        decode = self.config.decode
        beam = decode.beam if beam is None else beam
        alpha = decode.alpha if alpha is None else alpha
        if sampling is None and not 1 <= n_best <= beam:
            raise UserError(f"n-best ({n_best}) must be between 1 and the beam size ({beam})")
        sources = self.source_tokenizer.encode_batch(list(texts))
        limit = self.model.max_source_tokens
        for number, ids in enumerate(sources, start=1):
            if limit is not None and len(ids) > limit:
                raise UserError(f"input {number} has {len(ids)} tokens; this model accepts at most "
                                f"{limit}")
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in texts]
        nonempty = [i for i, ids in enumerate(sources) if ids]
        lengths = [len(sources[i]) for i in nonempty]
        for batch in source_batches(lengths, batch_tokens or decode.batch_tokens):
            indices = [nonempty[j] for j in batch]
            src, src_mask = (tensor.to(self.device) for tensor in
                             source_tensor([sources[i] for i in indices]))
            with torch.inference_mode(), self._autocast():
                found = self._search(src, src_mask, beam, alpha, n_best, need_attention, sampling)
            for index, hypotheses in zip(indices, found):
                results[index] = hypotheses
        return [Translation(text, self.source_tokenizer.pieces(text) if sources[i] else [],
                            [self._describe(h) for h in results[i]])
                for i, text in enumerate(texts)]

    def _search(self, src, src_mask, beam, alpha, n_best, need_attention, sampling):
        decode = self.config.decode
        lengths = (decode.max_len_a, decode.max_len_b, decode.min_len)
        if sampling is not None:
            return sample_search(self.model, src, src_mask, sampling, n_best, *lengths, need_attention)
        if beam == 1:
            return [[h] for h in greedy_search(self.model, src, src_mask, *lengths, need_attention)]
        return beam_search(self.model, src, src_mask, beam, alpha, *lengths, n_best, need_attention)

    @torch.inference_mode()
    def self_attention(self, translation: Translation) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder ``(layers, heads, S+1, S+1)`` and decoder ``(layers, heads, T+1, T+1)``
        self-attention of a translation's best hypothesis, by a teacher-forced pass (source
        EOS and target BOS included); :class:`UserError` for models without it."""
        src, src_mask = (tensor.to(self.device) for tensor in
                         source_tensor([self.source_tokenizer.encode(translation.source)]))
        tgt_in = torch.tensor([[BOS_ID, *translation.best.ids]], device=self.device)
        with self._autocast():
            encoder, decoder = self.model.self_attention(src, src_mask, tgt_in)
        return encoder.float().cpu(), decoder.float().cpu()

    def _describe(self, hypothesis: Hypothesis) -> TranslatedHypothesis:
        tokenizer = self.target_tokenizer
        return TranslatedHypothesis(tokenizer.decode(hypothesis.tokens), hypothesis.score,
                                    hypothesis.log_prob,
                                    [tokenizer.id_to_piece(i) for i in hypothesis.tokens],
                                    hypothesis.tokens, hypothesis.attention)


def hard_alignment(translation: Translation, hypothesis: TranslatedHypothesis, source_tokenizer,
                   target_tokenizer) -> list[tuple[int, int]]:
    """``(source word, target word)`` pairs: each output piece aligned to the source piece it
    attends to most (last layer, heads averaged), pieces mapped to words."""
    if hypothesis.attention is None or not hypothesis.tokens:
        return []
    attention = hypothesis.attention[:len(hypothesis.tokens), -1].mean(dim=1)    # (T, S)
    source_words = source_tokenizer.word_ids(translation.source_tokens)
    target_words = target_tokenizer.word_ids(hypothesis.tokens)
    attention = attention[:, :len(source_words)]                  # not the source EOS
    return sorted({(source_words[int(row.argmax())], target_words[position])
                   for position, row in enumerate(attention)})
