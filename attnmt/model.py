"""``Seq2Seq``: one interface over every architecture (DESIGN.md "Models and decoding state").

* ``forward(src, src_mask, tgt_in, tgt_mask) -> logits (B, T, V)``: teacher forcing;
* ``encode(src, src_mask) -> memory``: encoder output plus per-source precomputation;
* ``decode_step(prev_tokens (B,), state, memory) -> (log_probs (B, V), state, attention)``;
  ``state=None`` at the first step. ``state`` and ``memory`` reorder themselves with
  ``index_select``, so search never looks at the model type.
"""

from __future__ import annotations

import torch
from torch import nn

from attnmt.config import ModelConfig
from attnmt.data import PAD_ID
from attnmt.errors import UserError
from attnmt.rnn import (BahdanauDecoder, LuongDecoder, PlainDecoder, RNNEncoder,
                        build_rnn_attention)
from attnmt.transformer import Embedder, TransformerDecoder, TransformerEncoder


class Seq2Seq(nn.Module):
    """Encoder, decoder and the output projection (generator) to target-vocabulary logits."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, generator: nn.Linear,
                 config: ModelConfig):
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.config = config

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor):
        """``src (B, S)``, ``src_mask (B, 1, S)`` -> memory (RNNMemory or TransformerMemory)."""
        return self.decoder.init_memory(self.encoder(src, src_mask), src_mask)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ``tgt_in (B, T)``, ``tgt_mask (B, T, T)`` -> logits ``(B, T, V)``."""
        return self.generator(self.features(src, src_mask, tgt_in, tgt_mask))

    def features(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor,
                 tgt_mask: torch.Tensor) -> torch.Tensor:
        """Teacher-forced decoder outputs ``(B, T, D)``, before the output projection
        (training fuses the projection into the loss, see :mod:`attnmt.loss`)."""
        return self.decoder(tgt_in, tgt_mask, self.encode(src, src_mask))

    def decode_step(self, prev_tokens: torch.Tensor, state, memory, need_attention: bool = True):
        """One target position for every batch entry.

        Returns ``log_probs (B, V)`` (float32), the new state, and the attention over the
        source: ``(B, S)`` for RNNs, ``(B, layers, heads, S)`` for the Transformer, None for
        the no-attention baseline (or when ``need_attention`` is False).
        """
        output, state, attention = self.decoder.step(prev_tokens, state, memory, need_attention)
        return torch.log_softmax(self.generator(output).float(), dim=-1), state, attention

    def num_parameters(self) -> int:
        """Trainable parameters, tied weights counted once."""
        return sum(parameter.numel() for parameter in self.parameters())


def build_model(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    """The model a config describes. Impossible combinations fail here with one clear message."""
    try:
        if config.arch == "transformer":
            encoder, decoder = _build_transformer(config, src_vocab_size, tgt_vocab_size)
        else:
            encoder, decoder = _build_rnn(config, src_vocab_size, tgt_vocab_size)
    except ValueError as error:
        raise UserError(f"model config: {error}") from None
    generator = nn.Linear(decoder.output_dim, tgt_vocab_size)
    _tie_embeddings(config, encoder, decoder, generator)
    return Seq2Seq(encoder, decoder, generator, config)


def _build_transformer(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    def embedder(vocab_size):
        return Embedder(vocab_size, config.d_model, config.max_positions,
                        config.positions == "learned", config.dropout, PAD_ID)

    sizes = (config.d_model, config.heads, config.ffn_dim, config.dropout,
             config.attention_dropout, config.ffn_dropout, config.norm == "pre",
             config.scale_attention)
    encoder = TransformerEncoder(embedder(src_vocab_size), config.encoder_layers, *sizes)
    decoder = TransformerDecoder(embedder(tgt_vocab_size), config.decoder_layers, *sizes)
    for module in (*encoder.layers, *decoder.layers):      # Glorot init, as in the paper's code
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
    return encoder, decoder


def _build_rnn(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    encoder = RNNEncoder(src_vocab_size, config.embed_dim, config.hidden_dim, config.encoder_layers,
                         config.cell, config.bidirectional, config.dropout, PAD_ID)
    shared = (tgt_vocab_size, config.embed_dim, config.hidden_dim, config.decoder_layers,
              config.cell, encoder.output_dim, config.dropout, PAD_ID)
    if config.decoder == "none":
        return encoder, PlainDecoder(*shared)
    attention = build_rnn_attention(config.attention, config.local_window, config.hidden_dim,
                                    encoder.output_dim, config.attention_dim, config.max_source_len)
    if config.decoder == "bahdanau":
        return encoder, BahdanauDecoder(*shared, attention)
    return encoder, LuongDecoder(*shared, attention, config.input_feeding)


def _tie_embeddings(config: ModelConfig, encoder, decoder, generator: nn.Linear) -> None:
    """``decoder``: target embedding = output projection; ``all``: the source embedding too."""
    if config.tie_embeddings == "none":
        return
    target = decoder.embedding
    if target.weight.shape != generator.weight.shape:
        raise UserError(f"model config: tie_embeddings needs the decoder output size "
                        f"({generator.in_features}) to equal the embedding size "
                        f"({target.embedding_dim}); set embed_dim = hidden_dim or tie_embeddings: none")
    generator.weight = target.weight
    if config.tie_embeddings == "all":
        source = encoder.embedding
        if source.weight.shape != target.weight.shape:
            raise UserError("model config: tie_embeddings: all needs one joint vocabulary "
                            f"(source {source.num_embeddings} and target {target.num_embeddings} "
                            "entries); use data.joint_vocab: true or tie_embeddings: decoder")
        source.weight = target.weight
