"""Token-budget batches from length-sorted examples, and their tensors.

Training batches: examples are shuffled by the seed and epoch, stably sorted by
(target, source) length so that a batch holds sentences of nearly equal length
(little padding), cut where ``sentences x longest padded length`` would pass the
token budget, and the batch order is shuffled. The same seed and epoch always give
the same batches, which is what exact resume relies on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.masks import padding_mask, target_mask


@dataclass
class Batch:
    src: torch.Tensor            # (B, S) source ids + EOS, padded
    src_mask: torch.Tensor       # (B, 1, S)
    tgt_in: torch.Tensor         # (B, T) BOS + target ids
    tgt_out: torch.Tensor        # (B, T) target ids + EOS
    tgt_mask: torch.Tensor       # (B, T, T) padding and causal
    indices: list[int]           # positions of the examples in their corpus

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int,
                  seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
    """Example indices grouped into batches of at most ``batch_tokens`` padded tokens.

    A batch costs ``len(batch) * max(longest source + 1, longest target + 1)`` (EOS/BOS
    included); an example longer than the budget alone gets a batch of its own. Every
    index appears in exactly one batch.
    """
    count = len(src_lengths)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(count)
    else:
        order = np.arange(count)
    order = order[np.lexsort((src_lengths[order], tgt_lengths[order]))]   # stable: ties stay shuffled
    padded_lengths = np.maximum(src_lengths, tgt_lengths) + 1
    batches = _cut(order.tolist(), padded_lengths, batch_tokens)
    if shuffle:
        permutation = np.random.default_rng([seed, epoch, 1]).permutation(len(batches))
        batches = [batches[i] for i in permutation]
    return batches


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


def pad(sequences: list[list[int]], prefix: list[int] = (), suffix: list[int] = ()) -> torch.Tensor:
    """``(B, max length)`` tensor of ``prefix + sequence + suffix`` rows, padded with PAD_ID."""
    rows = [list(prefix) + list(sequence) + list(suffix) for sequence in sequences]
    out = torch.full((len(rows), max(len(row) for row in rows)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def source_tensor(sources: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids + EOS, padded, and the source mask ``(B, 1, S)``."""
    src = pad(sources, suffix=[EOS_ID])
    return src, padding_mask(src, PAD_ID)


def make_batch(sources: list[list[int]], targets: list[list[int]], indices: list[int]) -> Batch:
    src, src_mask = source_tensor(sources)
    tgt_in = pad(targets, prefix=[BOS_ID])
    tgt_out = pad(targets, suffix=[EOS_ID])
    return Batch(src, src_mask, tgt_in, tgt_out, target_mask(tgt_in, PAD_ID), indices)
