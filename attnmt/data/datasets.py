"""From the ``data`` section of a config to tokenized splits ready for batching."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnmt.config import DataConfig
from attnmt.data.batching import Batch, make_batch
from attnmt.data.corpus import ParallelCorpus, read_multi30k, read_parallel
from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError


def load_split(config: DataConfig, split: str) -> ParallelCorpus:
    """Raw text of ``split`` (``train``, ``valid`` or ``test``) of the configured dataset."""
    if config.dataset == "numbers":
        sizes = {"train": config.numbers_train, "valid": config.numbers_valid,
                 "test": config.numbers_test}
        return numbers_corpus(split, config.src_lang, config.tgt_lang, config.numbers_max, sizes,
                              config.numbers_seed)
    if config.dataset == "multi30k":
        return read_multi30k(split, config.src_lang, config.tgt_lang, config.dir)
    prefix = getattr(config, split)
    if not prefix:
        raise UserError(f"data.{split} is not set: give the corpus prefix (e.g. corpus/{split} "
                        f"for corpus/{split}.{config.src_lang} and corpus/{split}.{config.tgt_lang})")
    return read_parallel(prefix, config.src_lang, config.tgt_lang)


@dataclass
class TokenizedSplit:
    corpus: ParallelCorpus
    sources: list[list[int]]
    targets: list[list[int]]
    src_lengths: np.ndarray
    tgt_lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.sources)

    def batch(self, indices: list[int]) -> Batch:
        return make_batch([self.sources[i] for i in indices], [self.targets[i] for i in indices],
                          indices)


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
