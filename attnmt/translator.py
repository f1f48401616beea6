"""``Translator``: load a run directory and translate raw text.

The one path that the command line, plots, experiments and the server share::

    translator = Translator.from_run("runs/multi30k_de_en_transformer")
    for translation in translator.translate(["Ein Hund läuft."], beam=5, n_best=2):
        print(translation.best.text, translation.best.score)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from attnmt.checkpoint import load_weights
from attnmt.config import Config, load_config
from attnmt.data import BOS_ID, PAD_ID
from attnmt.data.batching import source_batches, source_tensor
from attnmt.data.tokenizers import load_tokenizers
from attnmt.process import resolve_precision
from attnmt.run import RunDirectory
from attnmt.errors import UserError
from attnmt.masks import target_mask
from attnmt.model import Seq2Seq, build_model
from attnmt.search import Hypothesis, beam_search, greedy_search


@dataclass
class TranslatedHypothesis:
    text: str                         # detokenised output
    score: float                      # search score (length-normalised log-probability in beam)
    log_prob: float
    tokens: list[str]                 # output pieces, without EOS
    ids: list[int]
    attention: torch.Tensor | None    # (output tokens + EOS, source tokens + EOS[, layers, heads])


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
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.config = config
        self.autocast_dtype = autocast_dtype
        self.max_source_tokens = self._max_source_tokens()

    @classmethod
    def from_run(cls, path: str | Path, checkpoint: str = "best",
                 precision: str = "fp32") -> "Translator":
        """Load ``config.yaml``, the tokenizers and ``<checkpoint>.safetensors`` of a run.

        ``checkpoint`` is ``best`` (falls back to ``last``), ``last``, or a file path.
        ``precision``: ``fp32``, ``bf16`` or ``auto`` (bf16 autocast for decoding, only on CPUs
        that run it natively; see :func:`attnmt.distributed.resolve_precision`).
        """
        run = Path(path)
        if not (run / "config.yaml").is_file():
            raise UserError(f"{run} is not an attnmt run directory (no config.yaml)")
        autocast_dtype = resolve_precision(precision, torch.device("cpu"), setting="precision")
        config = load_config(run / "config.yaml")
        source_tokenizer, target_tokenizer = load_tokenizers(run)
        model = build_model(config.model, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        load_weights(model, RunDirectory(run).weights(checkpoint))
        return cls(model, source_tokenizer, target_tokenizer, config, autocast_dtype)

    def _max_source_tokens(self) -> int:
        model = self.config.model
        if model.arch == "transformer":
            return model.max_positions - 1                        # EOS takes one position
        if model.decoder != "none" and model.attention == "location":
            return model.max_source_len - 1
        return 100_000

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=self.autocast_dtype)

    def translate(self, texts: list[str], beam: int | None = None, n_best: int = 1,
                  alpha: float | None = None, batch_tokens: int | None = None,
                  need_attention: bool = False) -> list[Translation]:
        """Translate raw texts; results come in input order, ``n_best`` hypotheses each.

        Empty (or whitespace-only) texts get one empty hypothesis. A text longer than the
        model accepts raises :class:`UserError` naming it.
        """
        decode = self.config.decode
        beam = decode.beam if beam is None else beam
        alpha = decode.alpha if alpha is None else alpha
        if not 1 <= n_best <= beam:
            raise UserError(f"n-best ({n_best}) must be between 1 and the beam size ({beam})")
        sources = self.source_tokenizer.encode_batch(list(texts))
        for number, ids in enumerate(sources, start=1):
            if len(ids) > self.max_source_tokens:
                raise UserError(f"input {number} has {len(ids)} tokens; this model accepts at most "
                                f"{self.max_source_tokens}")
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in texts]
        nonempty = [i for i, ids in enumerate(sources) if ids]
        lengths = [len(sources[i]) for i in nonempty]
        for batch in source_batches(lengths, batch_tokens or decode.batch_tokens):
            indices = [nonempty[j] for j in batch]
            src, src_mask = source_tensor([sources[i] for i in indices])
            with torch.inference_mode(), self._autocast():
                if beam == 1:
                    found = [[h] for h in greedy_search(self.model, src, src_mask, decode.max_len_a,
                                                        decode.max_len_b, decode.min_len,
                                                        need_attention)]
                else:
                    found = beam_search(self.model, src, src_mask, beam, alpha, decode.max_len_a,
                                        decode.max_len_b, decode.min_len, n_best, need_attention)
            for index, hypotheses in zip(indices, found):
                results[index] = hypotheses
        return [Translation(text, self.source_tokenizer.pieces(text) if sources[i] else [],
                            [self._describe(h) for h in results[i]])
                for i, text in enumerate(texts)]

    @torch.inference_mode()
    def self_attention(self, translation: Translation) -> tuple[torch.Tensor, torch.Tensor]:
        """Transformer self-attention of a translation's best hypothesis, by a teacher-forced pass:
        encoder ``(layers, heads, S+1, S+1)`` and decoder ``(layers, heads, T+1, T+1)``
        (source EOS and target BOS included)."""
        if self.config.model.arch != "transformer":
            raise UserError("self-attention exists only in Transformer models")
        src, src_mask = source_tensor([self.source_tokenizer.encode(translation.source)])
        states, encoder_weights = self.model.encoder(src, src_mask, need_weights=True)
        tgt_in = torch.tensor([[BOS_ID, *translation.best.ids]])
        memory = self.model.decoder.init_memory(states, src_mask)
        _, decoder_weights = self.model.decoder(tgt_in, target_mask(tgt_in, PAD_ID), memory,
                                                need_weights=True)
        return (torch.stack([weights[0] for weights in encoder_weights]),
                torch.stack([self_weights[0] for self_weights, _ in decoder_weights]))

    def _describe(self, hypothesis: Hypothesis) -> TranslatedHypothesis:
        tokenizer = self.target_tokenizer
        return TranslatedHypothesis(tokenizer.decode(hypothesis.tokens), hypothesis.score,
                                    hypothesis.log_prob,
                                    [tokenizer.id_to_piece(i) for i in hypothesis.tokens],
                                    hypothesis.tokens, hypothesis.attention)


def hard_alignment(translation: Translation, hypothesis: TranslatedHypothesis, source_tokenizer,
                   target_tokenizer) -> list[tuple[int, int]]:
    """``(source word, target word)`` pairs: each output piece aligned to the source piece it
    attends to most (Transformers: last layer, heads averaged), pieces mapped to words."""
    if hypothesis.attention is None or not hypothesis.tokens:
        return []
    attention = hypothesis.attention[:len(hypothesis.tokens)]
    if attention.dim() == 4:                                      # (T, layers, heads, S)
        attention = attention[:, -1].mean(dim=1)
    source_words = source_tokenizer.word_ids(translation.source_tokens)
    target_words = target_tokenizer.word_ids(hypothesis.tokens)
    attention = attention[:, :len(source_words)]                  # not the source EOS
    return sorted({(source_words[int(row.argmax())], target_words[position])
                   for position, row in enumerate(attention)})
