"""The tensors of a batch: padded ids with EOS and BOS, and their masks."""

from __future__ import annotations

from dataclasses import dataclass

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


def pad(sequences: list[list[int]], prefix: list[int] = (), suffix: list[int] = (),
        multiple: int = 1) -> torch.Tensor:
    """``(B, L)`` tensor of ``prefix + sequence + suffix`` rows, padded with PAD_ID; ``L`` is
    the longest row rounded up to a multiple of ``multiple``."""
    rows = [list(prefix) + list(sequence) + list(suffix) for sequence in sequences]
    width = -(-max(len(row) for row in rows) // multiple) * multiple
    return torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows], dtype=torch.long)


def source_tensor(sources: list[list[int]], pad_multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids + EOS, padded, and the source mask ``(B, 1, S)``."""
    src = pad(sources, suffix=[EOS_ID], multiple=pad_multiple)
    return src, padding_mask(src, PAD_ID)


def make_batch(sources: list[list[int]], targets: list[list[int]], indices: list[int],
               pad_multiple: int = 1) -> Batch:
    src, src_mask = source_tensor(sources, pad_multiple)
    tgt_in = pad(targets, prefix=[BOS_ID], multiple=pad_multiple)
    tgt_out = pad(targets, suffix=[EOS_ID], multiple=pad_multiple)
    return Batch(src, src_mask, tgt_in, tgt_out, target_mask(tgt_in, PAD_ID), indices)
