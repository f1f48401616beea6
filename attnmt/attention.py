"""Every attention mechanism of docs/mechanisms.md, section 3, behind one interface.

Scorers implement ``score(query, key) -> (B, Tq, Tk)``; the :class:`Attention`
base class masks the scores, normalises them with a softmax and takes the
weighted sum of the values::

    context, weights = scorer(query (B, Tq, Dq), key (B, Tk, Dk), value (B, Tk, Dv), mask)
    # context (B, Tq, Dv), weights (B, Tq, Tk)

Masks are bool with True = attend (see :mod:`attnmt.masks`). Masked scores are
filled with ``torch.finfo(dtype).min``; a row whose every key is masked gets
zero weights and a zero context, never NaN.

Per-source work (the key projection of ``General`` and ``Additive``, the K/V
projections of multi-head cross-attention) is done by ``prepare_keys`` /
``project_kv``; callers keep the result and pass it back in on every decoder
step, so nothing is stashed on the module.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim with masked positions given exactly zero weight.

    Args:
        scores: ``(..., Tq, Tk)``.
        mask: bool, broadcastable to ``scores``, True = attend; None attends everywhere.

    Returns:
        weights ``(..., Tq, Tk)``; rows sum to 1, fully masked rows are all zero.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # A fully masked row is uniform after the softmax (all scores equal the fill value);
    # zeroing masked positions afterwards turns it into zeros without any NaN.
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)


class Attention(nn.Module):
    """Base class: ``scores -> mask -> softmax -> weighted sum``.

    Subclasses implement :meth:`score_prepared` and, when part of the score depends
    on the keys alone, :meth:`prepare_keys` (computed once per source).
    """

    def prepare_keys(self, key: torch.Tensor) -> torch.Tensor:
        """Per-source precomputation ``(B, Tk, Dk) -> (B, Tk, *)``; identity by default."""
        return key

    def score_prepared(self, query: torch.Tensor, prepared_keys: torch.Tensor) -> torch.Tensor:
        """Scores ``(B, Tq, Tk)`` for query ``(B, Tq, Dq)`` against prepared keys."""
        raise NotImplementedError

    def score(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``e``: query ``(B, Tq, Dq)``, key ``(B, Tk, Dk)`` -> ``(B, Tq, Tk)``."""
        return self.score_prepared(query, self.prepare_keys(key))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None,
                prepared_keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(context (B, Tq, Dv), weights (B, Tq, Tk))``.

        ``mask`` is ``(B, 1 or Tq, Tk)`` bool; ``prepared_keys`` is the cached
        :meth:`prepare_keys` of ``key`` (recomputed when None).
        """
        prepared = self.prepare_keys(key) if prepared_keys is None else prepared_keys
        weights = masked_softmax(self.score_prepared(query, prepared), mask)
        return torch.bmm(weights, value), weights


def _require_equal_dims(name: str, query_dim: int, key_dim: int) -> None:
    if query_dim != key_dim:
        raise ValueError(f"{name} attention needs equal query and key sizes, got query {query_dim} "
                         f"and key {key_dim}; use 'general' or 'additive', which project")


class Dot(Attention):
    """Luong dot score ``e_i = s^T h_i``; no parameters, sizes must match."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        _require_equal_dims("dot", query_dim, key_dim)

    def score_prepared(self, query, prepared_keys):
        return torch.bmm(query, prepared_keys.transpose(1, 2))


class ScaledDot(Attention):
    """Vaswani scaled dot-product ``e_i = q^T k_i / sqrt(d_k)``."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        _require_equal_dims("scaled-dot", query_dim, key_dim)
        self.scale = 1.0 / math.sqrt(key_dim)

    def score_prepared(self, query, prepared_keys):
        return torch.bmm(query, prepared_keys.transpose(1, 2)) * self.scale


class General(Attention):
    """Luong general (bilinear) score ``e_i = s^T W h_i``; ``W h`` is the per-source part."""

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.key_to_query = nn.Linear(key_dim, query_dim, bias=False)

    def prepare_keys(self, key):
        return self.key_to_query(key)                                     # (B, Tk, Dq)

    def score_prepared(self, query, prepared_keys):
        return torch.bmm(query, prepared_keys.transpose(1, 2))


class Additive(Attention):
    """Bahdanau additive (concat, MLP) score ``e_i = v^T tanh(W_1 h_i + W_2 s)``.

    Query and key sizes may differ; ``attention_dim`` is the size of the hidden layer.
    """

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int):
        super().__init__()
        self.key_layer = nn.Linear(key_dim, attention_dim, bias=False)      # W_1
        self.query_layer = nn.Linear(query_dim, attention_dim, bias=False)  # W_2
        self.energy = nn.Linear(attention_dim, 1, bias=False)               # v

    def prepare_keys(self, key):
        return self.key_layer(key)                                          # (B, Tk, A)

    def score_prepared(self, query, prepared_keys):
        hidden = torch.tanh(prepared_keys.unsqueeze(1) + self.query_layer(query).unsqueeze(2))
        return self.energy(hidden).squeeze(-1)                              # (B, Tq, Tk)


class Location(Attention):
    """Luong location score ``e = W_a s_t``: from the query alone.

    Scores are produced for ``max_source_len`` positions and cut to the real key
    length; the mask removes the padding.
    """

    def __init__(self, query_dim: int, max_source_len: int):
        super().__init__()
        self.max_source_len = max_source_len
        self.position_scores = nn.Linear(query_dim, max_source_len)

    def score_prepared(self, query, prepared_keys):
        source_len = prepared_keys.size(1)
        if source_len > self.max_source_len:
            raise ValueError(f"location attention was built for sources of at most "
                             f"{self.max_source_len} tokens, got {source_len}")
        return self.position_scores(query)[..., :source_len]


class LocalAttention(Attention):
    """Luong local-p attention around a predicted centre, usable with any scorer.

    ``p_t = S * sigmoid(v_p^T tanh(W_p s_t))`` with S the real source length;
    the scorer's softmax is restricted to the window ``|j - p_t| <= D`` and
    multiplied by ``exp(-(j - p_t)^2 / (2 sigma^2))``, ``sigma = D / 2``. As in the
    paper the final weights do not sum to one.
    """

    def __init__(self, scorer: Attention, query_dim: int, half_window: int, hidden_dim: int):
        super().__init__()
        if half_window < 1:
            raise ValueError(f"local attention needs a half-window D >= 1, got {half_window}")
        self.scorer = scorer
        self.half_window = half_window
        self.centre_hidden = nn.Linear(query_dim, hidden_dim, bias=False)   # W_p
        self.centre_out = nn.Linear(hidden_dim, 1, bias=False)              # v_p

    def prepare_keys(self, key):
        return self.scorer.prepare_keys(key)

    def score_prepared(self, query, prepared_keys):
        return self.scorer.score_prepared(query, prepared_keys)

    def centre(self, query: torch.Tensor, source_lengths: torch.Tensor) -> torch.Tensor:
        """Predicted centres ``p_t`` ``(B, Tq)`` for query ``(B, Tq, Dq)``, lengths ``(B, 1)``."""
        gate = torch.sigmoid(self.centre_out(torch.tanh(self.centre_hidden(query)))).squeeze(-1)
        return source_lengths * gate

    def forward(self, query, key, value, mask=None, prepared_keys=None):
        prepared = self.prepare_keys(key) if prepared_keys is None else prepared_keys
        batch, source_len = key.size(0), key.size(1)
        if mask is None:
            mask = torch.ones(batch, 1, source_len, dtype=torch.bool, device=key.device)
        lengths = mask.sum(-1).to(query.dtype)                              # (B, 1 or Tq)
        positions = torch.arange(source_len, device=key.device, dtype=query.dtype)
        distance = positions - self.centre(query, lengths).unsqueeze(-1)    # (B, Tq, Tk)
        window = distance.abs() <= self.half_window
        sigma = self.half_window / 2
        weights = masked_softmax(self.score_prepared(query, prepared), mask & window)
        weights = weights * torch.exp(-distance.square() / (2 * sigma ** 2))
        return torch.bmm(weights, value), weights


def build_scorer(kind: str, query_dim: int, key_dim: int, attention_dim: int,
                 max_source_len: int) -> Attention:
    """One scorer by name: ``dot | general | additive | scaled_dot | location``."""
    if kind == "dot":
        return Dot(query_dim, key_dim)
    if kind == "scaled_dot":
        return ScaledDot(query_dim, key_dim)
    if kind == "general":
        return General(query_dim, key_dim)
    if kind == "additive":
        return Additive(query_dim, key_dim, attention_dim)
    if kind == "location":
        return Location(query_dim, max_source_len)
    raise ValueError(f"unknown attention score {kind!r}; "
                     "choose one of dot, general, additive, scaled_dot, location")


# --- scaled dot-product attention on (..., T, D) tensors ------------------------------------

def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None,
                                 chunk_size: int | None = None,
                                 need_weights: bool = True,
                                 dropout_p: float = 0.0,
                                 scale: float | None = None,
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(q k^T / sqrt(d)) v`` on ``q (..., Tq, D)``, ``k (..., Tk, D)``, ``v (..., Tk, Dv)``.

    Three paths, one result:

    * the plain path (reference) materialises the weights and returns ``(out, weights)``;
    * ``chunk_size``: the memory-efficient online-softmax algorithm over blocks of
      queries and keys; never builds the ``Tq x Tk`` matrix; returns ``(out, None)``;
    * ``need_weights=False``: PyTorch's fused kernel, returns ``(out, None)``; except for a
      single query (a decoding step), where the plain path measured 2-3x faster than the
      fused kernel on CPU (5,000 rows, 4 heads, 20-40 keys).

    ``mask`` is bool, broadcastable to ``(..., Tq, Tk)``, True = attend.
    ``dropout_p`` drops attention weights (training only; the caller passes 0 in eval).
    ``scale`` multiplies the scores: ``1 / sqrt(D)`` by default (1.0 gives the unscaled dot
    product of the scaling experiment).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if chunk_size is not None:
        if dropout_p:
            raise ValueError("the chunked attention path has no dropout; use it for inference")
        return _chunked_attention(q, k, v, mask, chunk_size, scale), None
    if not need_weights and q.size(-2) > 1:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                             scale=scale)
        return out, None
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    weights = masked_softmax(scores, mask)
    dropped = F.dropout(weights, dropout_p) if dropout_p else weights
    return torch.matmul(dropped, v), weights if need_weights else None


def _chunked_attention(q, k, v, mask, chunk_size, scale):
    """Online softmax (Milakov & Gimelshein 2018; Rabe & Staats 2021) over query and key blocks."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    per_query_mask = mask is not None and mask.size(-2) > 1
    blocks = []
    for start in range(0, q.size(-2), chunk_size):
        block_mask = mask[..., start:start + chunk_size, :] if per_query_mask else mask
        blocks.append(_online_softmax_rows(q[..., start:start + chunk_size, :], k, v,
                                           block_mask, chunk_size, scale))
    return torch.cat(blocks, dim=-2)


def _online_softmax_rows(q, k, v, mask, chunk_size, scale):
    """Attention for a block of queries ``(..., Cq, D)``, visiting keys ``chunk_size`` at a time.

    Keeps, per query, the running max ``m``, the running denominator ``l`` and the
    running weighted sum ``acc`` (at least float32); each new key block rescales them by
    ``exp(m_old - m_new)``. Masked keys contribute ``exp(-inf) = 0``.
    """
    stats_dtype = torch.promote_types(q.dtype, torch.float32)   # float32, or float64 inputs
    stats_shape = q.shape[:-1] + (1,)
    running_max = q.new_full(stats_shape, float("-inf"), dtype=stats_dtype)
    denominator = q.new_zeros(stats_shape, dtype=stats_dtype)
    accumulator = q.new_zeros(q.shape[:-1] + (v.size(-1),), dtype=stats_dtype)
    q = q * scale
    for start in range(0, k.size(-2), chunk_size):
        stop = start + chunk_size
        scores = torch.matmul(q, k[..., start:stop, :].transpose(-2, -1)).to(stats_dtype)
        if mask is not None:
            scores = scores.masked_fill(~mask[..., start:stop], float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        safe_max = new_max.masked_fill(new_max == float("-inf"), 0.0)   # rows masked so far
        if scores.requires_grad:         # amax's backward keeps the scores: no in-place
            probs = torch.exp(scores - safe_max)
        else:                            # inference: reuse the block's memory
            probs = scores.sub_(safe_max).exp_()
        rescale = torch.exp(running_max - safe_max)
        denominator = denominator * rescale + probs.sum(dim=-1, keepdim=True)
        accumulator = accumulator * rescale + torch.matmul(probs.to(v.dtype), v[..., start:stop, :])
        running_max = new_max
    out = accumulator / denominator.clamp_min(torch.finfo(stats_dtype).tiny)  # 0/tiny = 0
    return out.to(q.dtype)


class KVCache:
    """Keys and values of the positions decoded so far, grown in place for incremental decoding.

    The buffers ``(B, H, capacity, D/H)`` have room to grow, so appending one position
    writes one slot instead of copying the whole cache (``torch.cat`` would make each
    step cost O(t)). Several caches may share buffers (each step returns a new cache
    object); a shared counter of filled positions makes appending copy-on-write, so
    continuing an older cache never overwrites positions a newer one relies on.
    """

    def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None,
                 length: int = 0, filled: list[int] | None = None):
        self.keys, self.values, self.length = keys, values, length
        self._filled = filled if filled is not None else [length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> "KVCache":
        """Add positions ``(B, H, n, D/H)``; returns the cache of ``length + n`` positions."""
        end = self.length + keys.size(2)
        owns_tail = self.keys is not None and self._filled[0] == self.length
        if not owns_tail or end > self.keys.size(2):
            self._reallocate(keys, capacity=max(16, 2 * end))
        self.keys[:, :, self.length:end] = keys
        self.values[:, :, self.length:end] = values
        self._filled[0] = end
        return KVCache(self.keys, self.values, end, self._filled)

    def _reallocate(self, like: torch.Tensor, capacity: int) -> None:
        batch, heads, _, head_dim = like.shape
        keys = like.new_empty(batch, heads, capacity, head_dim)
        values = like.new_empty(batch, heads, capacity, head_dim)
        if self.length:
            keys[:, :, :self.length] = self.keys[:, :, :self.length]
            values[:, :, :self.length] = self.values[:, :, :self.length]
        self.keys, self.values, self._filled = keys, values, [self.length]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part: keys and values ``(B, H, length, D/H)``."""
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]

    def index_select(self, index: torch.Tensor) -> "KVCache":
        """Reorder or repeat batch entries (beam search); the result owns new buffers of the
        same capacity, and only the filled positions are copied."""
        if self.keys is None:
            return KVCache()
        keys = self.keys.new_empty((len(index), *self.keys.shape[1:]))
        values = self.values.new_empty((len(index), *self.values.shape[1:]))
        filled = slice(0, self.length)
        torch.index_select(self.keys[:, :, filled], 0, index, out=keys[:, :, filled])
        torch.index_select(self.values[:, :, filled], 0, index, out=values[:, :, filled])
        return KVCache(keys, values, self.length)


class MultiHeadAttention(nn.Module):
    """``MultiHead(Q, K, V) = Concat(head_1..head_h) W^O``, ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``.

    Used three ways:

    * self-attention: ``forward(x, x, x, mask)``;
    * incremental decoding: ``forward(x_t, x_t, x_t, cache=cache)`` appends the new
      position's keys and values to the :class:`KVCache` and returns the grown cache
      (start from ``KVCache()``);
    * cross-attention: ``project_kv(memory, memory)`` once per source, then
      ``attend(query, k, v, mask)`` on every step.
    """

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, bias: bool = True,
                 scaled: bool = True):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.scale = None if scaled else 1.0          # False: plain dot product (experiments)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, D) -> (B, H, T, D/H)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)

    def project_kv(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, Tk, D)`` -> per-head ``(B, H, Tk, D/H)`` each."""
        return self._split_heads(self.k_proj(key)), self._split_heads(self.v_proj(value))

    def attend(self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor | None = None, need_weights: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Query ``(B, Tq, D)`` against projected ``k, v (B, H, Tk, D/H)``.

        ``mask`` is ``(B, 1 or Tq, Tk)`` bool. Returns ``(out (B, Tq, D),
        weights (B, H, Tq, Tk) or None)``.
        """
        batch, length, d_model = query.shape
        head_mask = None if mask is None else mask.unsqueeze(1)           # (B, 1, Tq|1, Tk)
        out, weights = scaled_dot_product_attention(
            self._split_heads(self.q_proj(query)), k, v, head_mask,
            need_weights=need_weights, dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale)
        out = out.transpose(1, 2).reshape(batch, length, d_model)
        return self.out_proj(out), weights

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False):
        """Returns ``(out (B, Tq, D), weights (B, H, Tq, Tk) or None, cache or None)``.

        With ``cache`` holding the keys and values of ``t`` earlier positions, the new
        ones are appended and attention runs over all ``t + Tk`` positions.
        """
        k, v = self.project_kv(key, value)
        if cache is not None:
            cache = cache.append(k, v)
            k, v = cache.tensors()
        out, weights = self.attend(query, k, v, mask, need_weights)
        return out, weights, cache
