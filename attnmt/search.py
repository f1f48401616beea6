"""Decoding: model-agnostic through ``decode_step`` and ``index_select``.

Search never looks at the model type: it encodes once, feeds the previous tokens to
``model.decode_step`` and reorders ``state`` and ``memory`` with ``index_select``.
Sentences that finish leave the batch, so the remaining ones decode faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnmt.data import BOS_ID, EOS_ID


@dataclass
class Hypothesis:
    tokens: list[int]                       # output ids, without BOS and EOS
    score: float                            # search score (log-probability, length-normalised in beam)
    log_prob: float                         # sum of token log-probabilities, EOS included
    attention: torch.Tensor | None = None   # (T, S) for RNNs, (T, layers, heads, S) for Transformers


def max_output_lengths(src_mask: torch.Tensor, a: float, b: int) -> torch.Tensor:
    """``(B,)`` maximum output lengths ``a * source length + b`` (source EOS not counted)."""
    source_lengths = src_mask.sum(-1).squeeze(1) - 1
    return (source_lengths.float() * a + b).long().clamp_min(1)


@torch.no_grad()
def greedy_search(model, src: torch.Tensor, src_mask: torch.Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10, min_len: int = 0,
                  need_attention: bool = False) -> list[Hypothesis]:
    """Argmax at each step, feeding the output back in. One hypothesis per source sentence.

    ``src (B, S)``, ``src_mask (B, 1, S)``. A sentence stops at EOS or at its maximum length.
    """
    memory = model.encode(src, src_mask)
    limits = max_output_lengths(src_mask, max_len_a, max_len_b)
    batch = src.size(0)
    rows = torch.arange(batch)                         # original sentence of each live row
    prev = torch.full((batch,), BOS_ID, dtype=torch.long, device=src.device)
    tokens, log_probs_sum = [[] for _ in range(batch)], [0.0] * batch
    attention = [[] for _ in range(batch)]
    state = None
    for step in range(int(limits.max())):
        log_probs, state, step_attention = model.decode_step(prev, state, memory, need_attention)
        if step < min_len:
            log_probs[:, EOS_ID] = float("-inf")
        best_log_prob, best = log_probs.max(dim=-1)
        finished = (best == EOS_ID) | (step + 1 >= limits[rows].to(best.device))
        for row, sentence in enumerate(rows.tolist()):
            log_probs_sum[sentence] += float(best_log_prob[row])
            if best[row] != EOS_ID:
                tokens[sentence].append(int(best[row]))
            if step_attention is not None:
                attention[sentence].append(step_attention[row].float().cpu())
        if finished.all():
            break
        keep = (~finished).nonzero().squeeze(1)
        if len(keep) < len(rows):
            state, memory = state.index_select(keep), memory.index_select(keep)
            rows, best = rows[keep.cpu()], best[keep]
        prev = best
    return [Hypothesis(tokens[i], log_probs_sum[i], log_probs_sum[i],
                       torch.stack(attention[i]) if attention[i] else None) for i in range(batch)]
