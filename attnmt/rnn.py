"""Recurrent encoder-decoders: docs/mechanisms.md, sections 2 and 4.

* :class:`RNNEncoder`: RNN / GRU / LSTM, stacked, optionally bidirectional
  (``h_j = [h_j(forward); h_j(backward)]``), packed so padding never enters a state.
* :class:`PlainDecoder` (``decoder: none``): Sutskever 2014; the source reaches the
  decoder only through its initial state, the fixed-length context vector.
* :class:`BahdanauDecoder`: scores from the previous state ``s_{i-1}``, the context
  enters the recurrent update ``s_i = f(s_{i-1}, y_{i-1}, c_i)``, deep (maxout) output
  from ``s_i``, ``y_{i-1}``, ``c_i``.
* :class:`LuongDecoder`: scores from the current state ``s_t``, attentional state
  ``tanh(W_c [a_t; s_t])``, optional input feeding.

Every decoder has the same three methods: ``init_memory`` (once per source),
``step`` (one target position) and ``forward`` (teacher forcing, which is the
same ``step`` applied left to right, so incremental decoding equals training).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from attnmt.dropout import Dropout
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnmt.attention import Attention, LocalAttention, build_scorer


def _rnn_class(cell: str) -> type[nn.RNNBase]:
    if cell == "gru":
        return nn.GRU
    if cell == "lstm":
        return nn.LSTM
    if cell == "rnn":
        return nn.RNN
    raise ValueError(f"unknown RNN cell {cell!r}; choose rnn, gru or lstm")


class ScaledEmbedding(nn.Embedding):
    """Token embeddings drawn from N(0, 1/dim) and multiplied by ``sqrt(dim)`` on lookup.

    Tied to the output projection, PyTorch's N(0, 1) would start the logits with a standard
    deviation near sqrt(dim) (a first loss of 26 nats per token for the Bahdanau preset
    instead of about ln V = 9); unscaled, the N(0, 1/dim) vectors would enter the recurrent
    cells at 1/sqrt(dim) of the scale of the context or attentional vector beside them, and
    the Luong preset learns several times slower. The scale is a saved buffer, so weights
    trained without it fail to load instead of translating wrongly.
    """

    def __init__(self, vocab_size: int, dim: int, pad_id: int):
        super().__init__(vocab_size, dim, padding_idx=pad_id)
        nn.init.normal_(self.weight, std=dim ** -0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()
        self.register_buffer("scale", torch.tensor(dim ** 0.5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens (...)`` -> ``(..., dim)``."""
        return super().forward(tokens) * self.scale


@dataclass
class RNNState:
    """Decoder state between steps."""
    hidden: torch.Tensor                # (L, B, H)
    cell: torch.Tensor | None = None    # (L, B, H), LSTM only
    feed: torch.Tensor | None = None    # (B, H), Luong input feeding: previous attentional state

    def index_select(self, index: torch.Tensor) -> "RNNState":
        """Reorder (or repeat) batch entries: beam search calls this after each step."""
        return RNNState(self.hidden.index_select(1, index),
                        None if self.cell is None else self.cell.index_select(1, index),
                        None if self.feed is None else self.feed.index_select(0, index))


@dataclass
class RNNMemory:
    """Everything the decoder reads from one encoded source batch."""
    states: torch.Tensor                # (B, S, Dk) encoder outputs: keys and values
    mask: torch.Tensor                  # (B, 1, S) True = real source token
    keys: torch.Tensor | None           # (B, S, *) the scorer's prepared keys; None without attention
    initial: RNNState                   # decoder state at the first step (from the bridge)

    def index_select(self, index: torch.Tensor) -> "RNNMemory":
        return RNNMemory(self.states.index_select(0, index), self.mask.index_select(0, index),
                         None if self.keys is None else self.keys.index_select(0, index),
                         self.initial.index_select(index))


@dataclass
class EncoderOutput:
    states: torch.Tensor                # (B, S, Dk)
    final_hidden: torch.Tensor          # (B, Dk) top layer's last states, both directions
    final_cell: torch.Tensor | None     # (B, Dk) LSTM only


class RNNEncoder(nn.Module):
    def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                 bidirectional: bool, dropout: float, pad_id: int):
        super().__init__()
        self.embedding = ScaledEmbedding(vocab_size, embed_dim, pad_id)
        self.dropout = Dropout(dropout)
        self.rnn = _rnn_class(cell)(embed_dim, hidden_dim, layers, batch_first=True,
                                    bidirectional=bidirectional,
                                    dropout=dropout if layers > 1 else 0.0)
        self.directions = 2 if bidirectional else 1
        self.output_dim = hidden_dim * self.directions

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor) -> EncoderOutput:
        """``src (B, S)``, ``src_mask (B, 1, S)`` -> states ``(B, S, directions * H)``."""
        lengths = src_mask.sum(-1).squeeze(1).clamp_min(1).cpu()
        packed = pack_padded_sequence(self.dropout(self.embedding(src)), lengths,
                                      batch_first=True, enforce_sorted=False)
        outputs, final = self.rnn(packed)
        states, _ = pad_packed_sequence(outputs, batch_first=True, total_length=src.size(1))
        hidden, cell = final if isinstance(final, tuple) else (final, None)
        return EncoderOutput(states, self._top_layer(hidden),
                             None if cell is None else self._top_layer(cell))

    def _top_layer(self, final: torch.Tensor) -> torch.Tensor:
        """``(layers * directions, B, H)`` -> top layer, directions concatenated ``(B, directions * H)``."""
        top = final[-self.directions:]                                    # (directions, B, H)
        return top.transpose(0, 1).reshape(top.size(1), -1)


class RNNDecoderBase(nn.Module):
    """Embedding, recurrent stack, bridge and output size shared by the three decoders."""

    def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                 encoder_dim: int, input_dim: int, dropout: float, pad_id: int):
        super().__init__()
        self.layers, self.hidden_dim, self.is_lstm = layers, hidden_dim, cell == "lstm"
        self.output_dim = hidden_dim
        self.embedding = ScaledEmbedding(vocab_size, embed_dim, pad_id)
        self.dropout = Dropout(dropout)
        self.rnn = _rnn_class(cell)(input_dim, hidden_dim, layers, batch_first=True,
                                    dropout=dropout if layers > 1 else 0.0)
        self.bridge = nn.Linear(encoder_dim, layers * hidden_dim)
        self.cell_bridge = nn.Linear(encoder_dim, layers * hidden_dim) if self.is_lstm else None
        self.attention: Attention | None = None

    def _bridge(self, layer: nn.Linear, final: torch.Tensor) -> torch.Tensor:
        """``(B, Dk)`` -> initial states ``(L, B, H)``: ``tanh(W_b h_final)`` for every layer."""
        return torch.tanh(layer(final)).view(final.size(0), self.layers, self.hidden_dim) \
            .transpose(0, 1).contiguous()

    def initial_state(self, encoded: EncoderOutput) -> RNNState:
        cell = self._bridge(self.cell_bridge, encoded.final_cell) if self.is_lstm else None
        return RNNState(self._bridge(self.bridge, encoded.final_hidden), cell)

    def init_memory(self, encoded: EncoderOutput, src_mask: torch.Tensor) -> RNNMemory:
        keys = None if self.attention is None else self.attention.prepare_keys(encoded.states)
        return RNNMemory(encoded.states, src_mask, keys, self.initial_state(encoded))

    def recur(self, inputs: torch.Tensor, state: RNNState) -> tuple[torch.Tensor, RNNState]:
        """One recurrent step: ``inputs (B, I)`` -> top-layer output ``(B, H)`` and the new state."""
        previous = (state.hidden, state.cell) if self.is_lstm else state.hidden
        output, final = self.rnn(inputs.unsqueeze(1), previous)
        hidden, cell = final if self.is_lstm else (final, None)
        return output.squeeze(1), RNNState(hidden, cell, state.feed)

    def attend(self, query: torch.Tensor, memory: RNNMemory) -> tuple[torch.Tensor, torch.Tensor]:
        """``query (B, H)`` -> context ``(B, Dk)`` and weights ``(B, 1, 1, S)``: the attention of
        every model has the shape (batch, layers, heads, source); an RNN has one of each."""
        context, weights = self.attention(query.unsqueeze(1), memory.states, memory.states,
                                          memory.mask, prepared_keys=memory.keys)
        return context.squeeze(1), weights.unsqueeze(1)

    def step(self, prev_tokens, state, memory, need_attention=True):
        raise NotImplementedError

    def forward(self, tgt_in: torch.Tensor, tgt_mask: torch.Tensor | None,
                memory: RNNMemory) -> torch.Tensor:
        """Teacher forcing: ``tgt_in (B, T)`` -> outputs ``(B, T, H)``; causal by construction."""
        state, outputs = None, []
        for position in range(tgt_in.size(1)):
            output, state, _ = self.step(tgt_in[:, position], state, memory, need_attention=False)
            outputs.append(output)
        return torch.stack(outputs, dim=1)


class PlainDecoder(RNNDecoderBase):
    """No attention: ``s_t = f(s_{t-1}, y_{t-1})``, ``s_0`` from the final encoder state."""

    def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                 encoder_dim: int, dropout: float, pad_id: int):
        super().__init__(vocab_size=vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim,
                         layers=layers, cell=cell, encoder_dim=encoder_dim, input_dim=embed_dim,
                         dropout=dropout, pad_id=pad_id)

    def step(self, prev_tokens, state, memory, need_attention=True):
        """``prev_tokens (B,)`` -> ``(output (B, H), state, None)``."""
        state = memory.initial if state is None else state
        output, state = self.recur(self.dropout(self.embedding(prev_tokens)), state)
        return self.dropout(output), state, None


class BahdanauDecoder(RNNDecoderBase):
    """RNNsearch: ``e_ij = a(s_{i-1}, h_j)``, ``s_i = f(s_{i-1}, [y_{i-1}; c_i])``,
    output ``maxout(U s_i + V y_{i-1} + C c_i)``."""

    def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                 encoder_dim: int, dropout: float, pad_id: int, attention: Attention):
        super().__init__(vocab_size=vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim,
                         layers=layers, cell=cell, encoder_dim=encoder_dim,
                         input_dim=embed_dim + encoder_dim, dropout=dropout, pad_id=pad_id)
        self.attention = attention
        self.readout = nn.Linear(hidden_dim + embed_dim + encoder_dim, 2 * hidden_dim)

    def step(self, prev_tokens, state, memory, need_attention=True):
        """``prev_tokens (B,)`` -> ``(output (B, H), state, weights (B, 1, 1, S))``."""
        state = memory.initial if state is None else state
        embedded = self.dropout(self.embedding(prev_tokens))
        context, weights = self.attend(state.hidden[-1], memory)          # from s_{i-1}
        output, state = self.recur(torch.cat([embedded, context], dim=-1), state)
        pieces = self.readout(torch.cat([output, embedded, context], dim=-1))
        maxout = pieces.view(pieces.size(0), self.hidden_dim, 2).amax(dim=-1)
        return self.dropout(maxout), state, weights


class LuongDecoder(RNNDecoderBase):
    """Luong 2015: ``s_t = f(s_{t-1}, [y_{t-1}; h~_{t-1}])`` (input feeding),
    ``a_t = attention(s_t, h)``, ``h~_t = tanh(W_c [a_t; s_t])``."""

    def __init__(self, *, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int, cell: str,
                 encoder_dim: int, dropout: float, pad_id: int, attention: Attention,
                 input_feeding: bool):
        super().__init__(vocab_size=vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim,
                         layers=layers, cell=cell, encoder_dim=encoder_dim,
                         input_dim=embed_dim + (hidden_dim if input_feeding else 0),
                         dropout=dropout, pad_id=pad_id)
        self.attention = attention
        self.input_feeding = input_feeding
        self.combine = nn.Linear(encoder_dim + hidden_dim, hidden_dim, bias=False)   # W_c

    def initial_state(self, encoded):
        state = super().initial_state(encoded)
        if self.input_feeding:
            state.feed = state.hidden.new_zeros(state.hidden.size(1), self.hidden_dim)
        return state

    def step(self, prev_tokens, state, memory, need_attention=True):
        """``prev_tokens (B,)`` -> ``(attentional state (B, H), state, weights (B, 1, 1, S))``."""
        state = memory.initial if state is None else state
        inputs = self.dropout(self.embedding(prev_tokens))
        if self.input_feeding:
            inputs = torch.cat([inputs, state.feed], dim=-1)
        output, state = self.recur(inputs, state)
        context, weights = self.attend(output, memory)                    # from s_t
        attentional = torch.tanh(self.combine(torch.cat([context, output], dim=-1)))
        if self.input_feeding:
            state.feed = attentional
        return self.dropout(attentional), state, weights


def build_rnn_attention(kind: str, local_window: int, query_dim: int, key_dim: int,
                        attention_dim: int, max_source_len: int) -> Attention:
    """The scorer named by the config, wrapped in local-p attention when ``local_window > 0``."""
    scorer = build_scorer(kind, query_dim, key_dim, attention_dim, max_source_len)
    if local_window:
        return LocalAttention(scorer, query_dim, local_window, attention_dim)
    return scorer
