"""From the ``data`` section of a config to tokenized splits ready for batching."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnmt.config import DataConfig
from attnmt.data.batching import Batch, make_batch
from attnmt.data.corpus import ParallelCorpus, read_multi30k, read_parallel
from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError


def load_split(config: DataConfig, split: str) -> ParallelCorpus:
    """Raw text of ``split`` (``train``, ``valid`` or ``test``) of the configured dataset.

    The training split also holds the pairs of ``data.extra_src_langs`` (same targets'
    language), after the ``src_lang`` pairs.
    """
    corpus = _load_pairs(config, split, config.src_lang)
    if split != "train":
        return corpus
    for lang in config.extra_src_langs:
        extra = _load_pairs(config, split, lang)
        corpus = ParallelCorpus(corpus.source + extra.source, corpus.target + extra.target,
                                f"{corpus.name} + {extra.name} ({lang})")
    return corpus


def _load_pairs(config: DataConfig, split: str, src_lang: str) -> ParallelCorpus:
    if config.dataset == "numbers":
        sizes = {"train": config.numbers_train, "valid": config.numbers_valid,
                 "test": config.numbers_test}
        return numbers_corpus(split, src_lang, config.tgt_lang, config.numbers_max, sizes,
                              config.numbers_seed)
    if config.dataset == "multi30k":
        return read_multi30k(split, src_lang, config.tgt_lang, config.dir)
    prefix = getattr(config, split)
    if not prefix:
        raise UserError(f"data.{split} is not set: give the corpus prefix (e.g. corpus/{split} "
                        f"for corpus/{split}.{config.src_lang} and corpus/{split}.{config.tgt_lang})")
    return read_parallel(prefix, src_lang, config.tgt_lang)


@dataclass
class TokenizedSplit:
    corpus: ParallelCorpus
    sources: list[list[int]]
    targets: list[list[int]]
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.sources)

    def batch(self, indices: list[int], pad_multiple: int = 1) -> Batch:
        return make_batch([self.sources[i] for i in indices], [self.targets[i] for i in indices],
                          indices, pad_multiple)


def drop_reason(source: list[int], target: list[int], max_len: int) -> str | None:
    """Why a training pair is dropped: ``empty`` (a side has no token), ``long`` (a side has more
    than ``max_len``), or None when it is kept."""
    if not source or not target:
        return "empty"
    if max(len(source), len(target)) > max_len:
        return "long"
    return None


def tokenize_split(corpus: ParallelCorpus, source_tokenizer, target_tokenizer,
                   max_len: int | None = None) -> tuple[TokenizedSplit, str]:
    """Encode a corpus; with ``max_len`` (training) drop empty and over-long pairs.

    Returns the split and a one-line report of what was dropped.
    """
    sources = source_tokenizer.encode_batch(corpus.source)
    targets = target_tokenizer.encode_batch(corpus.target)
    report = f"{corpus.name}: {len(sources)} pairs"
    if max_len is not None:
        reasons = [drop_reason(source, target, max_len) for source, target in zip(sources, targets)]
        empty = [i for i, reason in enumerate(reasons) if reason == "empty"]
        long = [i for i, reason in enumerate(reasons) if reason == "long"]
        kept = [i for i, reason in enumerate(reasons) if reason is None]
        if not kept:
            raise UserError(f"{corpus.name}: no training pairs left after filtering "
                            f"({len(empty)} empty, {len(long)} longer than data.max_len={max_len})")
        sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
        corpus = ParallelCorpus([corpus.source[i] for i in kept], [corpus.target[i] for i in kept],
                                corpus.name)
        report += f", kept {len(kept)} (dropped {len(empty)} empty, {len(long)} longer than {max_len} tokens)"
    split = TokenizedSplit(corpus, sources, targets,
                           np.array([len(s) for s in sources], dtype=np.int64),
                           np.array([len(t) for t in targets], dtype=np.int64))
    return split, report


def resample_subwords(split: TokenizedSplit, source_tokenizer, target_tokenizer, alpha: float,
                      nbest: int) -> TokenizedSplit:
    """The same pairs, both sides segmented anew by SentencePiece sampling; the detokenised
    text never changes. SentencePiece's sampler is not repeatable across processes, so
    training saves each epoch's segmentation (:func:`save_segmentation`) for exact resume."""
    sources = source_tokenizer.sample_batch(split.corpus.source, alpha, nbest)
    targets = target_tokenizer.sample_batch(split.corpus.target, alpha, nbest)
    return _with_ids(split, sources, targets)


def _with_ids(split: TokenizedSplit, sources: list[list[int]], targets: list[list[int]]):
    return TokenizedSplit(split.corpus, sources, targets,
                          np.array([len(s) for s in sources], dtype=np.int64),
                          np.array([len(t) for t in targets], dtype=np.int64))


def save_segmentation(split: TokenizedSplit, path: Path) -> None:
    """Write a split's token ids (both sides, with their lengths) atomically to ``path`` (.npz)."""
    temporary = path.with_name(f".{path.name}.tmp.npz")
    with open(temporary, "wb") as handle:
        np.savez(handle, src=np.concatenate([np.asarray(s, dtype=np.int32) for s in split.sources]),
                 tgt=np.concatenate([np.asarray(t, dtype=np.int32) for t in split.targets]),
                 src_lengths=split.src_lengths, tgt_lengths=split.tgt_lengths)
    os.replace(temporary, path)


def load_segmentation(split: TokenizedSplit, path: Path) -> TokenizedSplit:
    """``split``'s pairs with the token ids saved by :func:`save_segmentation`."""
    try:
        with np.load(path) as saved:
            sides = [_unflatten(saved[side], saved[f"{side}_lengths"]) for side in ("src", "tgt")]
    except (OSError, KeyError, ValueError) as error:
        raise UserError(f"{path} is not a saved segmentation ({error})") from None
    if len(sides[0]) != len(split):
        raise UserError(f"{path} holds {len(sides[0])} pairs, the training split {len(split)}")
    return _with_ids(split, *sides)


def _unflatten(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(lengths)
    return [ids[end - length:end].tolist() for end, length in zip(ends, lengths)]
