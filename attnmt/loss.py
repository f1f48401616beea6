"""Label-smoothed cross-entropy with a hand-written backward.

Same value as ``F.cross_entropy(..., label_smoothing=eps, reduction="sum")``:
``(1 - eps) * (lse - x_y) + eps * (lse - mean_j x_j)`` per token, with
``lse = logsumexp(x)``. PyTorch builds it from log_softmax, nll_loss and a sum, each
with its own pass over the ``tokens x vocabulary`` logits in backward; here the
gradient ``softmax(x) - (1 - eps) onehot(y) - eps / V`` is written in one go, which
on CPU saves about a tenth of a Transformer training step (see README, Training).
"""

from __future__ import annotations

import torch


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, smoothing: float, ignore_index: int):
        x = logits.to(torch.promote_types(logits.dtype, torch.float32))
        lse = torch.logsumexp(x, dim=-1)                                   # (N,)
        valid = targets != ignore_index
        safe_targets = targets.masked_fill(~valid, 0)
        nll = lse - x.gather(1, safe_targets.unsqueeze(1)).squeeze(1)
        smooth = lse - x.mean(dim=-1)
        per_token = ((1.0 - smoothing) * nll + smoothing * smooth) * valid
        ctx.save_for_backward(logits, safe_targets, lse, valid)
        ctx.smoothing = smoothing
        return per_token.sum()

    @staticmethod
    def backward(ctx, grad_output):
        logits, targets, lse, valid = ctx.saved_tensors
        smoothing, vocab = ctx.smoothing, logits.size(-1)
        grad = torch.exp(logits.to(lse.dtype) - lse.unsqueeze(1))          # softmax
        grad.sub_(smoothing / vocab)
        grad.scatter_add_(1, targets.unsqueeze(1),
                          torch.full_like(lse, -(1.0 - smoothing)).unsqueeze(1))
        grad.mul_((valid * grad_output).unsqueeze(1))
        return grad.to(logits.dtype), None, None, None


def label_smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, smoothing: float,
                                 ignore_index: int) -> torch.Tensor:
    """Summed loss over tokens: ``logits (N, V)`` (any float dtype), ``targets (N,)``."""
    return _LabelSmoothedCrossEntropy.apply(logits, targets, smoothing, ignore_index)
