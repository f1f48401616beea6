"""The Transformer (Vaswani et al. 2017): docs/mechanisms.md, section 5.

Encoder layer: self-attention, then the position-wise FFN; decoder layer: masked
self-attention, cross-attention over the encoder output, FFN. Each sub-layer is
wrapped as ``LayerNorm(x + Dropout(Sublayer(x)))`` (``norm: post``, the paper) or
``x + Dropout(Sublayer(LayerNorm(x)))`` (``norm: pre``, with a final LayerNorm).

Incremental decoding: each decoder layer keeps its self-attention keys and values
in :class:`TransformerState`; cross-attention keys and values are computed once
per source in :class:`TransformerMemory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from attnmt.attention import KVCache, MultiHeadAttention
from attnmt.dropout import Dropout
from attnmt.errors import UserError

KeyValue = tuple[torch.Tensor, torch.Tensor]       # (B, H, T, D/H) each


def sinusoidal_table(positions: int, d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(...)``: ``(positions, d)``.

    ``layout="halves"`` puts the same sines in the first half and the cosines in the second,
    ``[sin | cos]`` (MarianMT's and CTranslate2's layout): a fixed permutation of the model
    dimension. Computed in float64, then rounded once to float32."""
    position = torch.arange(positions, dtype=torch.float64).unsqueeze(1)
    inverse_frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                                  * (-math.log(10000.0) / d_model))
    sines = torch.sin(position * inverse_frequency)
    cosines = torch.cos(position * inverse_frequency)[:, : d_model // 2]
    table = torch.zeros(positions, d_model, dtype=torch.float64)
    if layout == "halves":
        half = sines.size(1)
        table[:, :half], table[:, half:] = sines, cosines
    else:
        table[:, 0::2], table[:, 1::2] = sines, cosines
    return table.float()


class Embedder(nn.Module):
    """Token embedding scaled by ``sqrt(d_model)`` plus positions, then dropout."""

    def __init__(self, *, vocab_size: int, d_model: int, max_positions: int,
                 learned_positions: bool, dropout: float, pad_id: int,
                 position_layout: str = "interleaved"):
        super().__init__()
        self.scale = math.sqrt(d_model)
        self.max_positions = max_positions
        self.tokens = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.tokens.weight, std=d_model ** -0.5)
        nn.init.zeros_(self.tokens.weight[pad_id])
        self.learned = nn.Embedding(max_positions, d_model) if learned_positions else None
        if not learned_positions:
            self.register_buffer("table", sinusoidal_table(max_positions, d_model, position_layout),
                                 persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``tokens (B, T)`` at positions ``offset..offset+T-1`` -> ``(B, T, D)``."""
        end = offset + tokens.size(1)
        if end > self.max_positions:
            raise UserError(f"sequence of {end} tokens exceeds model.max_positions "
                            f"({self.max_positions})")
        positions = (self.learned.weight if self.learned is not None else self.table)[offset:end]
        return self.dropout(self.tokens(tokens) * self.scale + positions)


ACTIVATION_MODULES = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}


class FeedForward(nn.Module):
    """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`` with dropout on the hidden layer; ``gelu``
    (exact, erf) or ``swish`` (``x * sigmoid(x)``) in place of ``max(0, .)``."""

    def __init__(self, d_model: int, ffn_dim: int, dropout: float, activation: str = "relu"):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, ffn_dim), ACTIVATION_MODULES[activation](),
                                 Dropout(dropout), nn.Linear(ffn_dim, d_model))

    @property
    def hidden_dropout(self) -> Dropout:
        """The dropout on the hidden layer (the trainer may start it late)."""
        return self.net[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SublayerNorm(nn.Module):
    """Residual connection and LayerNorm around one sub-layer, post- or pre-norm."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def input(self, x: torch.Tensor) -> torch.Tensor:
        """What the sub-layer reads: ``LayerNorm(x)`` for pre-norm, ``x`` for post-norm."""
        return self.norm(x) if self.pre_norm else x

    def output(self, x: torch.Tensor, sublayer_out: torch.Tensor) -> torch.Tensor:
        """``x + Dropout(out)``, normalised afterwards for post-norm."""
        x = x + self.dropout(sublayer_out)
        return x if self.pre_norm else self.norm(x)


@dataclass(frozen=True)
class LayerSettings:
    """The sizes and regularisation of one encoder or decoder layer (built with keywords)."""
    d_model: int
    heads: int
    ffn_dim: int
    dropout: float                       # on every sub-layer's output
    attention_dropout: float             # on attention weights
    ffn_dropout: float                   # on the FFN's hidden layer
    pre_norm: bool                       # LayerNorm before each sub-layer (else after the residual)
    scaled: bool = True                  # 1/sqrt(d_k) in the attention scores
    activation: str = "relu"             # the FFN's

    def attention(self) -> MultiHeadAttention:
        return MultiHeadAttention(self.d_model, self.heads, self.attention_dropout, scaled=self.scaled)

    def feed_forward(self) -> FeedForward:
        return FeedForward(self.d_model, self.ffn_dim, self.ffn_dropout, self.activation)

    def sublayer_norm(self) -> "SublayerNorm":
        return SublayerNorm(self.d_model, self.dropout, self.pre_norm)


class EncoderLayer(nn.Module):
    def __init__(self, settings: LayerSettings):
        super().__init__()
        self.self_attn = settings.attention()
        self.ffn = settings.feed_forward()
        self.attn_norm = settings.sublayer_norm()
        self.ffn_norm = settings.sublayer_norm()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False):
        """``x (B, S, D)``, ``mask (B, 1, S)`` -> ``(x, weights (B, H, S, S) or None)``."""
        h = self.attn_norm.input(x)
        attended, weights, _ = self.self_attn(h, h, h, mask, need_weights=need_weights)
        x = self.attn_norm.output(x, attended)
        return self.ffn_norm.output(x, self.ffn(self.ffn_norm.input(x))), weights


class DecoderLayer(nn.Module):
    def __init__(self, settings: LayerSettings):
        super().__init__()
        self.self_attn = settings.attention()
        self.cross_attn = settings.attention()
        self.ffn = settings.feed_forward()
        self.self_norm = settings.sublayer_norm()
        self.cross_norm = settings.sublayer_norm()
        self.ffn_norm = settings.sublayer_norm()

    def forward(self, x: torch.Tensor, self_mask: torch.Tensor | None, cross_kv: KeyValue,
                memory_mask: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False):
        """``x (B, T, D)``; ``self_mask (B, T, t+T)`` or None when decoding one new position.

        Returns ``(x, cache (None without one), self weights, cross weights (B, H, T, S))``.
        """
        h = self.self_norm.input(x)
        attended, self_weights, cache = self.self_attn(h, h, h, self_mask, cache=cache,
                                                       need_weights=need_weights)
        x = self.self_norm.output(x, attended)
        attended, cross_weights = self.cross_attn.attend(self.cross_norm.input(x), *cross_kv,
                                                         memory_mask, need_weights)
        x = self.cross_norm.output(x, attended)
        x = self.ffn_norm.output(x, self.ffn(self.ffn_norm.input(x)))
        return x, cache, self_weights, cross_weights


@dataclass
class TransformerState:
    """Decoder state: per-layer self-attention keys and values of the positions so far."""
    self_kv: list[KVCache]               # per layer, (B, H, t, D/H) keys and values
    length: int                          # t, the number of positions decoded

    def index_select(self, index: torch.Tensor) -> "TransformerState":
        return TransformerState([cache.index_select(index) for cache in self.self_kv], self.length)


@dataclass
class TransformerMemory:
    states: torch.Tensor                 # (B, S, D) encoder output
    mask: torch.Tensor                   # (B, 1, S)
    cross_kv: list[KeyValue]             # per decoder layer, (B, H, S, D/H) each

    def index_select(self, index: torch.Tensor) -> "TransformerMemory":
        return TransformerMemory(self.states.index_select(0, index), self.mask.index_select(0, index),
                                 [(k.index_select(0, index), v.index_select(0, index))
                                  for k, v in self.cross_kv])


class TransformerEncoder(nn.Module):
    def __init__(self, embedder: Embedder, layers: int, settings: LayerSettings):
        super().__init__()
        self.embedder = embedder
        self.embedding = embedder.tokens                 # for embedding tying
        self.layers = nn.ModuleList(EncoderLayer(settings) for _ in range(layers))
        self.final_norm = nn.LayerNorm(settings.d_model) if settings.pre_norm else nn.Identity()
        self.output_dim = settings.d_model

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, need_weights: bool = False):
        """``src (B, S)`` -> states ``(B, S, D)``; with ``need_weights`` also the per-layer
        self-attention weights ``(B, H, S, S)``."""
        x, weights = self.embedder(src), []
        for layer in self.layers:
            x, layer_weights = layer(x, src_mask, need_weights)
            weights.append(layer_weights)
        x = self.final_norm(x)
        return (x, weights) if need_weights else x


class TransformerDecoder(nn.Module):
    def __init__(self, embedder: Embedder, layers: int, settings: LayerSettings):
        super().__init__()
        self.embedder = embedder
        self.embedding = embedder.tokens                 # for embedding tying
        self.layers = nn.ModuleList(DecoderLayer(settings) for _ in range(layers))
        self.final_norm = nn.LayerNorm(settings.d_model) if settings.pre_norm else nn.Identity()
        self.output_dim = settings.d_model

    def init_memory(self, states: torch.Tensor, src_mask: torch.Tensor) -> TransformerMemory:
        """Cross-attention keys and values, once per source."""
        return TransformerMemory(states, src_mask,
                                 [layer.cross_attn.project_kv(states, states) for layer in self.layers])

    def forward(self, tgt_in: torch.Tensor, tgt_mask: torch.Tensor, memory: TransformerMemory,
                need_weights: bool = False):
        """Teacher forcing: ``tgt_in (B, T)``, ``tgt_mask (B, T, T)`` -> ``(B, T, D)``; with
        ``need_weights`` also per-layer ``(self weights, cross weights)``."""
        x, weights = self.embedder(tgt_in), []
        for layer, cross_kv in zip(self.layers, memory.cross_kv):
            x, _, self_weights, cross_weights = layer(x, tgt_mask, cross_kv, memory.mask,
                                                      need_weights=need_weights)
            weights.append((self_weights, cross_weights))
        x = self.final_norm(x)
        return (x, weights) if need_weights else x

    def step(self, prev_tokens: torch.Tensor, state: TransformerState | None,
             memory: TransformerMemory, need_attention: bool = True):
        """``prev_tokens (B,)`` -> ``(output (B, D), state, cross weights (B, layers, H, S) or None)``."""
        state = TransformerState([KVCache() for _ in self.layers], 0) if state is None else state
        x = self.embedder(prev_tokens.unsqueeze(1), offset=state.length)
        caches, weights = [], []
        for layer, cross_kv, cache in zip(self.layers, memory.cross_kv, state.self_kv):
            x, cache, _, cross_weights = layer(x, None, cross_kv, memory.mask, cache=cache,
                                               need_weights=need_attention)
            caches.append(cache)
            weights.append(cross_weights)
        attention = torch.stack(weights, dim=1).squeeze(3) if need_attention else None
        return self.final_norm(x).squeeze(1), TransformerState(caches, state.length + 1), attention
