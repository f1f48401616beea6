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

from attnmt.config import Config, load_config
from attnmt.data import BOS_ID
from attnmt.data.batching import source_batches, source_tensor
from attnmt.data.tokenizers import load_tokenizers
from attnmt.errors import UserError
from attnmt.model import Seq2Seq
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


@dataclass(frozen=True)
class SearchOptions:
    beam: int
    alpha: float
    n_best: int
    max_len_a: float
    max_len_b: int
    min_len: int
    need_attention: bool
    sampling: Sampling | None = None


class TorchEngine:
    """attnmt's own model and search (greedy, beam, sampling) in PyTorch."""
    name = "torch"

    def __init__(self, model: Seq2Seq, autocast_dtype: torch.dtype | None = None):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.description, self.attention_grid = model.description, model.attention_grid
        self.has_self_attention = model.has_self_attention
        self.max_source_tokens = model.max_source_tokens

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def search(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """``options.n_best`` hypotheses for each (non-empty) source of token ids."""
        src, src_mask = (tensor.to(self.device) for tensor in source_tensor(sources))
        lengths = (options.max_len_a, options.max_len_b, options.min_len)
        with torch.inference_mode(), self._autocast():
            if options.sampling is not None:
                return sample_search(self.model, src, src_mask, options.sampling, options.n_best,
                                     *lengths, options.need_attention)
            if options.beam == 1:
                return [[h] for h in greedy_search(self.model, src, src_mask, *lengths,
                                                   options.need_attention)]
            return beam_search(self.model, src, src_mask, options.beam, options.alpha, *lengths,
                               options.n_best, options.need_attention)

    @torch.inference_mode()
    def self_attention(self, source: list[int], target: list[int]):
        src, src_mask = (tensor.to(self.device) for tensor in source_tensor([source]))
        tgt_in = torch.tensor([[BOS_ID, *target]], device=self.device)
        with self._autocast():
            encoder, decoder = self.model.self_attention(src, src_mask, tgt_in)
        return encoder.float().cpu(), decoder.float().cpu()


class Translator:
    """Raw text in, detokenised hypotheses out, on either engine: tokenizing, checking
    lengths, batching by source tokens and the empty-input rule are the same for both."""

    def __init__(self, engine, source_tokenizer, target_tokenizer, config: Config):
        self.engine = engine
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.config = config

    @property
    def model(self) -> Seq2Seq:
        """The PyTorch model (the torch engine only)."""
        if not isinstance(self.engine, TorchEngine):
            raise UserError(f"this needs the PyTorch model; load the run with --engine torch, "
                            f"not {self.engine.name}")
        return self.engine.model

    @classmethod
    def from_run(cls, path: str | Path, checkpoint: str = "best", precision: str = "fp32",
                 device: str = "cpu", engine: str = "torch",
                 quantization: str = "int8") -> "Translator":
        """Load ``config.yaml``, the tokenizers and ``<checkpoint>.safetensors`` of a run.

        ``checkpoint`` is ``best`` (falls back to ``last``), ``last``, or a file path.
        ``precision``: ``fp32``, ``bf16`` or ``auto`` (bf16 autocast where the hardware runs
        it natively, see :func:`attnmt.process.resolve_precision`). ``device``: ``cpu``,
        ``cuda`` or ``auto``. ``engine``: ``torch``, or ``ctranslate2`` with the
        ``quantization`` of :mod:`attnmt.export` (exported into the run on first use).
        """
        run = RunDirectory(path)
        if not run.config.is_file():
            raise UserError(f"{run.path} is not an attnmt run directory (no config.yaml)")
        target = resolve_device(device, setting="device")
        if engine == "ctranslate2":
            from attnmt.ctranslate2_engine import CTranslate2Engine

            config = load_config(run.config)
            source_tokenizer, target_tokenizer = load_tokenizers(run.path)
            chosen = CTranslate2Engine.from_run(run, config, source_tokenizer, target_tokenizer,
                                                quantization, checkpoint, target)
        elif engine == "torch":
            autocast_dtype = resolve_precision(precision, target, setting="precision")
            config, source_tokenizer, target_tokenizer, model = run.load_model(checkpoint)
            chosen = TorchEngine(model.to(target), autocast_dtype)
        else:
            raise UserError(f"engine must be torch or ctranslate2; got {engine!r}")
        return cls(chosen, source_tokenizer, target_tokenizer, config)

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
        if sampling is None and not 1 <= n_best <= beam:
            raise UserError(f"n-best ({n_best}) must be between 1 and the beam size ({beam})")
        options = SearchOptions(beam, decode.alpha if alpha is None else alpha, n_best,
                                decode.max_len_a, decode.max_len_b, decode.min_len,
                                need_attention, sampling)
        sources = self.source_tokenizer.encode_batch(list(texts))
        limit = self.engine.max_source_tokens
        for number, ids in enumerate(sources, start=1):
            if limit is not None and len(ids) > limit:
                raise UserError(f"input {number} has {len(ids)} tokens; this model accepts at most "
                                f"{limit}")
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in texts]
        nonempty = [i for i, ids in enumerate(sources) if ids]
        lengths = [len(sources[i]) for i in nonempty]
        for batch in source_batches(lengths, batch_tokens or decode.batch_tokens):
            indices = [nonempty[j] for j in batch]
            for index, hypotheses in zip(indices, self.engine.search([sources[i] for i in indices],
                                                                     options)):
                results[index] = hypotheses
        return [Translation(text, self.source_tokenizer.pieces(text) if sources[i] else [],
                            [self._describe(h) for h in results[i]])
                for i, text in enumerate(texts)]

    def self_attention(self, translation: Translation) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder ``(layers, heads, S+1, S+1)`` and decoder ``(layers, heads, T+1, T+1)``
        self-attention of a translation's best hypothesis, by a teacher-forced pass (source
        EOS and target BOS included); :class:`UserError` for models without it."""
        if not self.engine.has_self_attention:
            raise UserError(f"no self-attention to show: {self.engine.description}")
        return self.engine.self_attention(self.source_tokenizer.encode(translation.source),
                                          translation.best.ids)

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
