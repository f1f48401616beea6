"""Output projection and label-smoothed cross-entropy, fused and chunked over tokens.

Per token, with logits ``x = W h + b`` and ``lse = logsumexp(x)``::

    loss = (1 - eps) * (lse - x_y) + eps * (lse - mean_j x_j)
    d loss / d x = softmax(x) - (1 - eps) onehot(y) - eps / V

the same value as ``F.cross_entropy(F.linear(h, W, b), y, label_smoothing=eps,
reduction="sum")``. Computing it ``chunk_tokens`` tokens at a time keeps every
temporary small (512 x 8000 floats = 16 MB instead of 130 MB for a 4k-token batch):
on CPU, tensors that large are mapped fresh from the kernel on every allocation and
page-fault on first touch, which made the loss a tenth of a Transformer training step
(see README, Training speed). The backward pass is written out, once per chunk.

Exponentials are taken of ``max(x - max_j x_j, -80)``. The words a trained model rules out
sit 90+ nats below the best one; their ``exp`` lands in float32's subnormal range, where
the CPU's vectorised ``exp`` falls to a path 50x slower (a third of a bf16 training step
once most of the logits were there). A term below e^-80 (about 2e-35) changes the loss
and its gradient by less than 1e-30, so nothing measurable is lost.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The autocast dtype when autocast is on for this device, else the tensor's own."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


EXP_FLOOR = -80.0


def _exp_shifted(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``exp(max(x - shift, EXP_FLOOR))`` in one new tensor; ``shift`` is at least ``max x``."""
    return (x - shift).clamp_min_(EXP_FLOOR).exp_()


def _logsumexp(x: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` over the last dimension of ``(N, V)`` logits, floored like the softmax."""
    peak = x.amax(dim=-1, keepdim=True)
    return (peak + _exp_shifted(x, peak).sum(dim=-1, keepdim=True).log()).squeeze(-1)


class _ProjectedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, smoothing, ignore_index, chunk_tokens):
        dtype = _compute_dtype(hidden)
        with torch.autocast(hidden.device.type, enabled=False):
            hidden_c, weight_c = hidden.to(dtype), weight.to(dtype)
            bias_c = None if bias is None else bias.to(dtype)
            valid = targets != ignore_index
            safe_targets = targets.masked_fill(~valid, 0)
            stats_dtype = torch.promote_types(dtype, torch.float32)
            total = hidden.new_zeros((), dtype=stats_dtype)
            lse_chunks, logit_chunks = [], []
            for start in range(0, hidden.size(0), chunk_tokens):
                stop = start + chunk_tokens
                logits = F.linear(hidden_c[start:stop], weight_c, bias_c)
                logit_chunks.append(logits)                      # kept for backward
                x = logits.to(stats_dtype)
                lse = _logsumexp(x)
                nll = lse - x.gather(1, safe_targets[start:stop].unsqueeze(1)).squeeze(1)
                smooth = lse - x.mean(dim=-1)
                total += (((1.0 - smoothing) * nll + smoothing * smooth) * valid[start:stop]).sum()
                lse_chunks.append(lse)
        ctx.save_for_backward(hidden_c, weight_c, bias_c, safe_targets, valid, torch.cat(lse_chunks),
                              *logit_chunks)
        ctx.smoothing, ctx.chunk_tokens = smoothing, chunk_tokens
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        hidden, weight, bias, targets, valid, lse, *logit_chunks = ctx.saved_tensors
        smoothing, vocab = ctx.smoothing, weight.size(0)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=lse.dtype)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=lse.dtype)
        for start, logits in zip(range(0, hidden.size(0), ctx.chunk_tokens), logit_chunks):
            stop = start + ctx.chunk_tokens
            grad = _exp_shifted(logits.to(lse.dtype), lse[start:stop].unsqueeze(1))   # softmax
            grad.sub_(smoothing / vocab)
            rows = torch.arange(grad.size(0), device=grad.device)
            grad[rows, targets[start:stop]] -= 1.0 - smoothing
            grad.mul_((valid[start:stop] * grad_output).unsqueeze(1))
            if grad_bias is not None:
                grad_bias += grad.sum(0)
            grad = grad.to(hidden.dtype)
            grad_hidden[start:stop] = grad @ weight
            grad_weight += (grad.t() @ hidden[start:stop]).to(lse.dtype)
        hidden_dtype, weight_dtype, bias_dtype = ctx.dtypes
        return (grad_hidden.to(hidden_dtype), grad_weight.to(weight_dtype),
                None if grad_bias is None else grad_bias.to(bias_dtype), None, None, None, None)


def projected_cross_entropy(hidden: torch.Tensor, generator: nn.Linear, targets: torch.Tensor,
                            smoothing: float, ignore_index: int,
                            chunk_tokens: int = 512) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of ``generator(hidden)``.

    ``hidden (N, D)`` decoder outputs, ``targets (N,)``; returns a scalar (float32 or wider).
    """
    return _ProjectedCrossEntropy.apply(hidden, generator.weight, generator.bias, targets,
                                        smoothing, ignore_index, chunk_tokens)
