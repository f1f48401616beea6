"""From the ``data`` section of a config to tokenized splits ready for batching."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnmt.config import DataConfig
from attnmt.data.tensors import Batch, make_batch
from attnmt.data.corpus import ParallelCorpus, read_multi30k, read_parallel
from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError


def load_split(config: DataConfig, split: str) -> ParallelCorpus:
    """Raw text of ``split`` (``train``, ``valid`` or ``test``) of the configured dataset,
    sources tagged as the model reads them (see :func:`tag_sources`).

    The training split also holds, after the ``src_lang`` pairs, the pairs of
    ``data.extra_src_langs`` or ``data.extra_tgt_langs``, then the synthetic pairs of
    ``data.synthetic`` mixed in by :func:`mix_synthetic`.
    """
    corpus = _load_pairs(config, split, config.src_lang, config.tgt_lang)
    if split != "train":
        return corpus
    extra = [(lang, config.tgt_lang) for lang in config.extra_src_langs]
    extra += [(config.src_lang, lang) for lang in config.extra_tgt_langs]
    corpus = concatenate([corpus, *(_load_pairs(config, split, *pair) for pair in extra)])
    if not config.synthetic:
        return corpus
    synthetic = concatenate([read_parallel(prefix, config.src_lang, config.tgt_lang)
                             for prefix in config.synthetic])
    synthetic = tag_sources(synthetic, [config.synthetic_tag, config.target_tag(config.tgt_lang)])
    return mix_synthetic(corpus, synthetic, config.synthetic_ratio)


def _load_pairs(config: DataConfig, split: str, src_lang: str, tgt_lang: str) -> ParallelCorpus:
    if config.dataset == "numbers":
        sizes = {"train": config.numbers_train, "valid": config.numbers_valid,
                 "test": config.numbers_test}
        corpus = numbers_corpus(split, src_lang, tgt_lang, config.numbers_max, sizes,
                                config.numbers_seed)
    elif config.dataset == "multi30k":
        corpus = read_multi30k(split, src_lang, tgt_lang, config.dir)
    else:
        prefix = getattr(config, split)
        if not prefix:
            raise UserError(f"data.{split} is not set: give the corpus prefix (e.g. corpus/{split} "
                            f"for corpus/{split}.{config.src_lang} and corpus/{split}.{config.tgt_lang})")
        corpus = read_parallel(prefix, src_lang, tgt_lang)
    if (src_lang, tgt_lang) != (config.src_lang, config.tgt_lang):
        corpus.name = f"{corpus.name} ({src_lang}-{tgt_lang})"
    return tag_sources(corpus, [config.target_tag(tgt_lang)])


def tag_sources(corpus: ParallelCorpus, tags: list[str]) -> ParallelCorpus:
    """The corpus with ``tags`` (those not empty) and a space before every source."""
    prefix = "".join(f"{tag} " for tag in tags if tag)
    if not prefix:
        return corpus
    return ParallelCorpus([prefix + text for text in corpus.source], corpus.target, corpus.name)


def concatenate(corpora: list[ParallelCorpus]) -> ParallelCorpus:
    if len(corpora) == 1:
        return corpora[0]
    return ParallelCorpus([text for corpus in corpora for text in corpus.source],
                          [text for corpus in corpora for text in corpus.target],
                          " + ".join(corpus.name for corpus in corpora))


def mix_synthetic(real: ParallelCorpus, synthetic: ParallelCorpus, ratio: float) -> ParallelCorpus:
    """Real pairs, repeated ``copies`` whole times, then ``ratio`` synthetic pairs per real one.

    ``copies = max(1, round(len(synthetic) / (ratio * len(real))))``: the synthetic pairs fill
    their share with the fewest real copies; when there are more than the share, a fixed
    random subset of them (the same on every machine) is kept, in corpus order.
    """
    copies = max(1, round(len(synthetic) / (ratio * len(real))))
    wanted = min(len(synthetic), round(ratio * copies * len(real)))
    kept = sorted(random.Random(len(synthetic)).sample(range(len(synthetic)), wanted))
    return ParallelCorpus(real.source * copies + [synthetic.source[i] for i in kept],
                          real.target * copies + [synthetic.target[i] for i in kept],
                          f"{real.name} x {copies} + {wanted} of {len(synthetic)} synthetic "
                          f"({synthetic.name})")


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
    sources = source_tokenizer.encode_tagged_batch(corpus.source)
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
