"""Attention masks: the only place they are built.

Convention everywhere in attnmt: masks are ``bool`` and **True = attend**.
A source mask has shape ``(B, 1, S)`` and broadcasts over query positions;
a target mask has shape ``(B, T, T)`` and is padding AND causal.
"""

from __future__ import annotations

import torch


def padding_mask(tokens_or_lengths: torch.Tensor, pad: int | None = None,
                 max_len: int | None = None) -> torch.Tensor:
    """Mask of the real (non-padding) positions.

    Args:
        tokens_or_lengths: either token ids ``(B, S)`` (then ``pad`` is required) or
            lengths ``(B,)`` (then ``max_len`` defaults to the largest length).
        pad: padding token id, for token input.
        max_len: padded length S, for length input.

    Returns:
        ``(B, 1, S)`` bool, True at real positions.
    """
    if tokens_or_lengths.dim() == 2:
        if pad is None:
            raise ValueError("padding_mask of token ids needs the pad id")
        return (tokens_or_lengths != pad).unsqueeze(1)
    if tokens_or_lengths.dim() != 1:
        raise ValueError(f"padding_mask expects tokens (B, S) or lengths (B,), "
                         f"got shape {tuple(tokens_or_lengths.shape)}")
    lengths = tokens_or_lengths
    width = int(lengths.max()) if max_len is None and lengths.numel() else (max_len or 0)
    positions = torch.arange(width, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1)


def causal_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``(1, T, T)`` bool: position t may attend to positions 0..t."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril().unsqueeze(0)


def target_mask(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """Decoder self-attention mask ``(B, T, T)``: padding AND causal, for tokens ``(B, T)``."""
    return padding_mask(tokens, pad) & causal_mask(tokens.size(1), tokens.device)
