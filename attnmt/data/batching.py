"""Token-budget batches from length-sorted examples (their tensors: :mod:`attnmt.data.tensors`).

Training batches: examples are shuffled by the seed and epoch, stably sorted by
(target, source) length so that a batch holds sentences of nearly equal length
(little padding), cut where ``sentences x longest padded length`` would pass the
token budget, and the batch order is shuffled. The same seed and epoch always give
the same batches, which is what exact resume relies on.

With ``pad_multiple`` m > 1, every length (EOS or BOS included) is padded up to a
multiple of m, and sentences are sorted by those padded lengths: an epoch's batches then
come in a few dozen shapes instead of hundreds. That matters where a matrix-product
kernel is compiled for each shape (oneDNN's bf16 kernels on CPU, see
records/performance.md); padding is masked everywhere, so no result changes.
"""

from __future__ import annotations

import numpy as np


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int,
                  seed: int = 0, epoch: int = 0, shuffle: bool = True,
                  pad_multiple: int = 1) -> list[list[int]]:
    """Example indices grouped into batches of at most ``batch_tokens`` padded tokens.

    A batch costs ``len(batch) * max(padded source, padded target length)``, where a
    padded length is ``length + 1`` (EOS/BOS) rounded up to a multiple of ``pad_multiple``;
    an example longer than the budget alone gets a batch of its own. Every index appears
    in exactly one batch.
    """
    count = len(src_lengths)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(count)
    else:
        order = np.arange(count)
    src_padded = padded_length(np.asarray(src_lengths), pad_multiple)
    tgt_padded = padded_length(np.asarray(tgt_lengths), pad_multiple)
    order = order[np.lexsort((src_padded[order], tgt_padded[order]))]     # stable: ties stay shuffled
    batches = _cut(order.tolist(), np.maximum(src_padded, tgt_padded), batch_tokens)
    if shuffle:
        permutation = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
        batches = [batches[i] for i in permutation]
    return batches


def padded_length(lengths: np.ndarray, pad_multiple: int) -> np.ndarray:
    """``lengths + 1`` (EOS or BOS) rounded up to a multiple of ``pad_multiple``."""
    return -(-(lengths + 1) // pad_multiple) * pad_multiple


def source_batches(src_lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Batches for translation: sorted by source length (longest first), no shuffling."""
    order = sorted(range(len(src_lengths)), key=lambda i: -src_lengths[i])
    return _cut(order, [length + 1 for length in src_lengths], batch_tokens)


def _cut(order: list[int], lengths, batch_tokens: int) -> list[list[int]]:
    """Consecutive runs of ``order`` whose ``count x longest length`` stays within the budget."""
    batches, current, longest = [], [], 0
    for index in order:
        length = int(lengths[index])
        if current and (len(current) + 1) * max(longest, length) > batch_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    return batches + ([current] if current else [])
