"""``Translator``: load a run directory (or several, as an ensemble) and translate raw text.

The one path that the command line, plots, experiments and the server share::

    translator = Translator.from_run("runs/multi30k_de_en_transformer")
    for translation in translator.translate(["Ein Hund läuft."], beam=5, n_best=2):
        print(translation.best.text, translation.best.score)

This module does not need PyTorch: the PyTorch engine (:mod:`attnmt.torch_engine`) is
imported only when a run is loaded with it, so a folder exported for CTranslate2
translates where PyTorch is not installed. Attention comes as NumPy arrays from both
engines. Loading a model changes nothing in the process (threads, allocator): the
commands choose those with :func:`attnmt.process.configure`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnmt.config import Config, load_config
from attnmt.data import UNK_ID
from attnmt.data.batching import source_batches
from attnmt.data.tokenizers import load_tokenizers
from attnmt.decoding import Hypothesis, Sampling, SearchOptions
from attnmt.errors import UserError
from attnmt.run import RunDirectory
from attnmt.shipped import resolve

ENGINES = ("auto", "torch", "ctranslate2")


@dataclass
class TranslatedHypothesis:
    text: str                         # detokenised output
    score: float                      # search score (length-normalised log-probability in beam)
    log_prob: float
    tokens: list[str]                 # output pieces, without EOS
    ids: list[int]
    attention: np.ndarray | None      # (output tokens + EOS, layers, heads, source tokens + EOS)


@dataclass
class Translation:
    source: str
    source_tokens: list[str]          # source pieces as the model read them, without EOS
    hypotheses: list[TranslatedHypothesis]
    tag_tokens: int = 0               # leading source pieces that are tags (<2de>), not the text
    source_ids: list[int] = field(default_factory=list)   # the ids of source_tokens
    search_steps: list[dict] | None = None    # with trace: the beam search, step by step

    @property
    def best(self) -> TranslatedHypothesis:
        return self.hypotheses[0]


def is_exported(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``attnmt export`` (a CTranslate2 model)."""
    return (Path(path) / "model.bin").is_file()


class Translator:
    """Raw text in, detokenised hypotheses out, on either engine: normalising, tagging,
    tokenizing, checking lengths, batching by source tokens and the empty-input rule are
    the same for both."""

    def __init__(self, engine, source_tokenizer, target_tokenizer, config: Config):
        self.engine = engine
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.config = config

    @property
    def model(self):
        """The PyTorch model (the torch engine only; an ensemble's combined model)."""
        if self.engine.name != "torch":
            raise UserError(f"this needs the PyTorch model; load the run with --engine torch, "
                            f"not {self.engine.name}")
        return self.engine.model

    @classmethod
    def from_run(cls, path: str | Path, checkpoint: str = "best", precision: str = "fp32",
                 device: str = "cpu", engine: str = "auto", quantization: str | None = None,
                 threads: int = 0) -> "Translator":
        """Load ``config.yaml``, the tokenizers and the weights of a run, an export, or a
        shipped model by name (``"de-en"``, :mod:`attnmt.shipped`).

        ``checkpoint`` is ``best`` (falls back to ``last``), ``last``, or a file path.
        ``precision``: ``fp32``, ``bf16`` or ``auto`` (the PyTorch engine: bf16 autocast
        where the hardware runs it natively). ``device``: ``cpu``, ``cuda`` or ``auto``.
        ``engine``: ``torch``, ``ctranslate2`` with the ``quantization`` of
        :mod:`attnmt.export` (exported into the run on first use; None: int8 for a run, an
        export's own weight type for an export), or ``auto``:
        CTranslate2 for a folder written by ``attnmt export``, else PyTorch. ``threads``:
        CTranslate2's (0: every core); PyTorch's are the process's.
        """
        return cls.from_runs([path], checkpoint, precision, device, engine, quantization, threads)

    @classmethod
    def from_runs(cls, paths: list[str | Path], checkpoint: str = "best", precision: str = "fp32",
                  device: str = "cpu", engine: str = "auto", quantization: str | None = None,
                  threads: int = 0) -> "Translator":
        """:meth:`from_run` for one run; for several, their ensemble (PyTorch engine): at
        every step of the search the runs' log-probabilities are averaged. The runs must
        share their vocabularies and languages."""
        if engine not in ENGINES:
            raise UserError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        if not paths:
            raise UserError("no run to translate with")
        paths = [resolve(path) for path in paths]
        runs = [RunDirectory(path) for path in paths]
        for run in runs:
            run.require_config()
        if engine == "auto":
            engine = "ctranslate2" if len(paths) == 1 and is_exported(paths[0]) else "torch"
        config = load_config(runs[0].config)
        source_tokenizer, target_tokenizer = load_tokenizers(Path(paths[0]))
        if engine == "ctranslate2":
            if len(paths) > 1:
                raise UserError("an ensemble of runs translates on the PyTorch engine only "
                                "(--engine torch): CTranslate2 decodes one model")
            from attnmt.ctranslate2_engine import CTranslate2Engine

            chosen = CTranslate2Engine.from_run(Path(paths[0]), config, source_tokenizer,
                                                target_tokenizer, quantization, checkpoint, device,
                                                threads)
        else:
            for path in paths[1:]:
                check_compatible(paths[0], config, source_tokenizer, target_tokenizer, path)
            from attnmt.torch_engine import TorchEngine

            chosen = TorchEngine.from_runs(paths, checkpoint, precision, device)
        return cls(chosen, source_tokenizer, target_tokenizer, config)

    def source_tag(self, target_lang: str | None) -> str:
        """The tag that starts every source for ``target_lang`` ('' for a one-target run);
        a language the run does not translate into is refused."""
        data = self.config.data
        lang = target_lang or data.tgt_lang
        if lang not in data.target_langs:
            raise UserError(f"target language {lang!r}: this model translates {data.src_lang} into "
                            f"{', '.join(data.target_langs)} only")
        return data.target_tag(lang)

    def translate(self, texts: list[str], beam: int | None = None, n_best: int = 1,
                  alpha: float | None = None, batch_tokens: int | None = None,
                  need_attention: bool = False, sampling: Sampling | None = None,
                  target_lang: str | None = None, prefix: str | list[str] | None = None,
                  trace: bool = False) -> list[Translation]:
        """Translate raw texts; results come in input order, ``n_best`` hypotheses each.

        With ``sampling``, the ``n_best`` hypotheses are samples (``beam`` is not used).
        ``target_lang`` chooses the output language of a one-to-many model (default: its
        ``data.tgt_lang``). ``prefix`` (one for every text, or a list of one per text):
        the words every output starts with, the model completing them (interactive
        translation). ``trace``: each translation's ``search_steps`` holds its beam search
        step by step (PyTorch engine). Texts that are empty after normalisation
        (whitespace, control characters) get one empty hypothesis. A text longer than the
        model accepts, or a prefix it cannot write, raises :class:`UserError` naming it.
        """
        decode = self.config.decode
        beam = decode.beam if beam is None else beam
        if sampling is None and not 1 <= n_best <= beam:
            raise UserError(f"n-best ({n_best}) must be between 1 and the beam size ({beam})")
        options = self.search_options(beam, n_best, alpha, need_attention, sampling)
        sources = self.source_ids(texts, target_lang)
        self.check_lengths(sources)
        prefixes = self.prefix_ids(prefix, sources) if prefix is not None else None
        if trace:
            self.check_trace(sampling)
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in texts]
        traces: list[list[dict] | None] = [[] if trace else None for _ in texts]
        nonempty = [i for i, ids in enumerate(sources) if ids]
        lengths = [len(sources[i]) for i in nonempty]
        for batch in source_batches(lengths, batch_tokens or decode.batch_tokens):
            indices = [nonempty[j] for j in batch]
            found = self.engine.search([sources[i] for i in indices], options,
                                       None if prefixes is None else [prefixes[i] for i in indices],
                                       [traces[i] for i in indices] if trace else None)
            for index, hypotheses in zip(indices, found):
                results[index] = hypotheses
        tag = self.source_tag(target_lang)
        return [Translation(text, ([tag] if tag else []) + self.source_tokenizer.pieces(text)
                            if sources[i] else [],
                            [self._describe(h) for h in results[i]],
                            int(bool(tag)) if sources[i] else 0, sources[i],
                            self._steps(traces[i]) if trace else None)
                for i, text in enumerate(texts)]

    def search_options(self, beam: int | None = None, n_best: int = 1, alpha: float | None = None,
                       need_attention: bool = False,
                       sampling: Sampling | None = None) -> SearchOptions:
        """How :meth:`translate` searches: the run's ``decode`` settings where not given,
        outputs at most as long as the model's positions."""
        decode = self.config.decode
        return SearchOptions(decode.beam if beam is None else beam,
                             decode.alpha if alpha is None else alpha, n_best, decode.max_len_a,
                             decode.max_len_b, decode.min_len, need_attention, sampling,
                             self.engine.max_output_tokens)

    def source_ids(self, texts: list[str], target_lang: str | None = None) -> list[list[int]]:
        """The ids the model reads for each text: the target-language tag of a one-to-many
        run, then the text, a tag typed in it read as text; [] for a text that is empty
        after normalisation."""
        tag = self.source_tag(target_lang)
        encoded = self.source_tokenizer.encode_batch(texts)
        if not tag:
            return encoded
        tag_id = self.source_tokenizer.tag_ids[tag]
        return [[tag_id, *ids] if ids else [] for ids in encoded]

    def check_lengths(self, sources: list[list[int]]) -> None:
        """A source longer than the model accepts is refused, numbered from 1."""
        limit = self.engine.max_source_tokens
        for number, ids in enumerate(sources, start=1):
            if limit is not None and len(ids) > limit:
                raise UserError(f"input {number} has {len(ids)} tokens; this model accepts at most "
                                f"{limit}")

    def check_trace(self, sampling: Sampling | None) -> None:
        """Search steps exist for beam search on the PyTorch engine; else one line saying so."""
        if sampling is not None:
            raise UserError("search steps are shown for beam search, not for sampling")
        if self.engine.name != "torch":
            raise UserError("the CTranslate2 engine does not expose the steps of its beam search; "
                            "serve the run with --engine torch to see them")

    def prefix_ids(self, prefix: str | list[str], sources: list[list[int]]) -> list[list[int]]:
        """The target ids of each text's prefix; one the model cannot write (pieces outside
        its vocabulary, or longer than the output its source may have) is refused."""
        texts = [prefix] * len(sources) if isinstance(prefix, str) else list(prefix)
        if len(texts) != len(sources):
            raise UserError(f"prefix: {len(texts)} prefixes for {len(sources)} texts")
        options = self.search_options()
        encoded = self.target_tokenizer.encode_batch(texts)
        for number, (text, ids, source) in enumerate(zip(texts, encoded, sources), start=1):
            if UNK_ID in ids:
                unknown = [piece for piece, i in zip(self.target_tokenizer.pieces(text), ids)
                           if i == UNK_ID]
                raise UserError(f"prefix {number}: {' '.join(unknown)!r} cannot be written with "
                                "this model's target vocabulary")
            room = options.output_limit(len(source)) - 1
            if source and len(ids) > room:
                raise UserError(f"prefix {number} has {len(ids)} tokens; the translation of text "
                                f"{number} may have at most {room}")
        return encoded

    def _steps(self, trace: list[dict]) -> list[dict]:
        """A beam search trace with pieces for ids (see :func:`attnmt.search.beam_search`)."""
        def described(items):
            return [{"tokens": [self.target_tokenizer.id_to_piece(i) for i in ids], "score": score}
                    for ids, score in items]

        return [{"step": step["step"], "kept": described(step["kept"]),
                 "pruned": described(step["pruned"]), "finished": described(step["finished"])}
                for step in trace]

    def self_attention(self, translation: Translation) -> tuple[np.ndarray, np.ndarray]:
        """Encoder ``(layers, heads, S+1, S+1)`` and decoder ``(layers, heads, T+1, T+1)``
        self-attention of a translation's best hypothesis, by a teacher-forced pass (source
        EOS and target BOS included); :class:`UserError` for models without it."""
        if not self.engine.has_self_attention:
            raise UserError(f"no self-attention to show: {self.engine.description}")
        return self.engine.self_attention(translation.source_ids, translation.best.ids)

    def _describe(self, hypothesis: Hypothesis) -> TranslatedHypothesis:
        tokenizer = self.target_tokenizer
        return TranslatedHypothesis(tokenizer.decode(hypothesis.tokens), hypothesis.score,
                                    hypothesis.log_prob,
                                    [tokenizer.id_to_piece(i) for i in hypothesis.tokens],
                                    hypothesis.tokens, hypothesis.attention)


def check_compatible(first: str | Path, config: Config, source_tokenizer, target_tokenizer,
                     other: str | Path, verb: str = "ensemble") -> None:
    """Runs to ensemble (or average) must read and write the same pieces with the same ids,
    in the same languages: one line naming the difference otherwise."""
    other_config = load_config(RunDirectory(other).config)
    mine, theirs = config.data, other_config.data
    if (mine.src_lang, mine.target_langs) != (theirs.src_lang, theirs.target_langs):
        raise UserError(f"cannot {verb} {first} ({mine.src_lang}->{','.join(mine.target_langs)}) "
                        f"with {other} ({theirs.src_lang}->{','.join(theirs.target_langs)})")
    for side, tokenizer, their_tokenizer in zip(("source", "target"),
                                                (source_tokenizer, target_tokenizer),
                                                load_tokenizers(Path(other))):
        if vocabulary(tokenizer) != vocabulary(their_tokenizer):
            raise UserError(f"cannot {verb} {first} with {other}: their {side} vocabularies "
                            "differ (the same id must mean the same piece in both)")


def vocabulary(tokenizer) -> tuple:
    """The pieces in id order and the text normalisation: what makes two tokenizers equal."""
    return (tokenizer.normalization,
            tuple(tokenizer.id_to_piece(index) for index in range(tokenizer.vocab_size)))


def hard_alignment(translation: Translation, hypothesis: TranslatedHypothesis, source_tokenizer,
                   target_tokenizer) -> list[tuple[int, int]]:
    """``(source word, target word)`` pairs: each output piece aligned to the source piece it
    attends to most (last layer, heads averaged), pieces mapped to words. Tags are not words
    of the source: they are never aligned and do not shift the numbering."""
    if hypothesis.attention is None or not hypothesis.tokens:
        return []
    attention = hypothesis.attention[:len(hypothesis.tokens), -1].mean(axis=1)    # (T, S)
    skip = translation.tag_tokens
    source_words = source_tokenizer.word_ids(translation.source_tokens[skip:])
    target_words = target_tokenizer.word_ids(hypothesis.tokens)
    attention = attention[:, skip:skip + len(source_words)]       # not the tags, not the EOS
    return sorted({(source_words[int(row.argmax())], target_words[position])
                   for position, row in enumerate(attention)})
