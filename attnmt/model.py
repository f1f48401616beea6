"""``Seq2Seq``: one interface over every architecture, and what a model can do.

* ``forward(src, src_mask, tgt_in, tgt_mask) -> logits (B, T, V)``: teacher forcing;
* ``encode(src, src_mask) -> memory``: encoder output plus per-source precomputation;
* ``decode_step(prev_tokens (B,), state, memory) -> (log_probs (B, V), state, attention)``;
  ``state=None`` at the first step. ``state`` and ``memory`` reorder themselves with
  ``index_select``, so search never looks at the model type. Attention has one shape
  for every model, ``(B, layers, heads, S)``: an RNN is one layer with one head.
* ``attention_grid`` (``(layers, heads)`` or None without attention),
  ``has_self_attention``, ``max_source_tokens`` and ``max_output_tokens`` say what the
  model can do, so the
  translator, plots and the server never ask which architecture it is.
"""

from __future__ import annotations

import torch
from torch import nn

from attnmt.config import ModelConfig
from attnmt.data import BOS_ID, PAD_ID
from attnmt.errors import UserError
from attnmt.masks import target_mask
from attnmt.rnn import (BahdanauDecoder, LuongDecoder, PlainDecoder, RNNEncoder,
                        build_rnn_attention)
from attnmt.transformer import Embedder, LayerSettings, TransformerDecoder, TransformerEncoder


class Seq2Seq(nn.Module):
    """Encoder, decoder and the output projection (generator) to target-vocabulary logits."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, generator: nn.Linear, *,
                 description: str, attention_grid: tuple[int, int] | None,
                 has_self_attention: bool, max_source_tokens: int | None,
                 max_output_tokens: int | None = None, marian_special_tokens: bool = False):
        super().__init__()
        self.encoder, self.decoder, self.generator = encoder, decoder, generator
        self.description = description                # e.g. "Transformer, 3+3 layers, 4 heads"
        self.attention_grid = attention_grid          # (layers, heads) of decode_step's attention
        self.has_self_attention = has_self_attention  # encoder and decoder self-attention to show
        self.max_source_tokens = max_source_tokens    # longest source without EOS; None: any
        self.max_output_tokens = max_output_tokens    # longest output with EOS; None: any
        self.marian_special_tokens = marian_special_tokens   # see decode_step

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
        source ``(B, layers, heads, S)``, None without attention (or when ``need_attention``
        is False).
        """
        output, state, attention = self.decoder.step(prev_tokens, state, memory, need_attention)
        logits = self.generator(output).float()
        if not self.marian_special_tokens:
            return torch.log_softmax(logits, dim=-1), state, attention
        # An imported MarianMT model: attnmt's <pad> has no row in MarianMT, so it is left out
        # of the softmax; <s> is MarianMT's <pad>, in its softmax but never output, as
        # transformers' generate bans it (bad_words_ids) after the softmax.
        logits[:, PAD_ID] = float("-inf")
        log_probs = torch.log_softmax(logits, dim=-1)
        log_probs[:, BOS_ID] = float("-inf")
        return log_probs, state, attention

    def self_attention(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor):
        """Encoder and decoder self-attention of one teacher-forced pass, for a batch of one:
        ``(layers, heads, S, S)`` and ``(layers, heads, T, T)``."""
        if not self.has_self_attention:
            raise UserError("this model has no self-attention (only the Transformer has)")
        states, encoder_weights = self.encoder(src, src_mask, need_weights=True)
        memory = self.decoder.init_memory(states, src_mask)
        _, decoder_weights = self.decoder(tgt_in, target_mask(tgt_in, PAD_ID), memory,
                                          need_weights=True)
        return (torch.stack([weights[0] for weights in encoder_weights]),
                torch.stack([self_weights[0] for self_weights, _ in decoder_weights]))

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
    if config.marian_special_tokens:
        _freeze_special_rows(encoder, decoder)
    return Seq2Seq(encoder, decoder, generator, **_abilities(config))


def _freeze_special_rows(encoder, decoder) -> None:
    """An imported MarianMT model's rows of ``<pad>`` and ``<s>`` keep their values (zero in
    MarianMT, whose decoder starts from a zero embedding): their gradients are dropped, so
    training never moves them and an export may start CTranslate2's decoder from zeros."""
    def keep_special_rows(gradient: torch.Tensor) -> torch.Tensor:
        gradient = gradient.clone()
        gradient[[PAD_ID, BOS_ID]] = 0
        return gradient

    for weight in {id(module.embedding.weight): module.embedding.weight for module in (encoder, decoder)}.values():
        weight.register_hook(keep_special_rows)


def _abilities(config: ModelConfig) -> dict:
    """What the model can do, so that the layers above it need not know what it is."""
    if config.arch == "transformer":
        return dict(description=f"Transformer, {config.encoder_layers}+{config.decoder_layers} "
                                f"layers, {config.heads} heads",
                    attention_grid=(config.decoder_layers, config.heads), has_self_attention=True,
                    max_source_tokens=config.max_positions - 1,             # EOS takes one
                    max_output_tokens=config.max_positions,     # BOS and all but EOS read
                    marian_special_tokens=config.marian_special_tokens)
    if config.decoder == "none":
        return dict(description=f"RNN, {config.cell.upper()}, no attention", attention_grid=None,
                    has_self_attention=False, max_source_tokens=None)
    location = config.attention == "location"                # scores a fixed number of positions
    return dict(description=f"RNN, {config.cell.upper()}, {config.decoder.capitalize()} attention "
                            f"({config.attention})",
                attention_grid=(1, 1), has_self_attention=False,
                max_source_tokens=config.max_source_len - 1 if location else None)


def _build_transformer(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    def embedder(vocab_size):
        return Embedder(vocab_size=vocab_size, d_model=config.d_model,
                        max_positions=config.max_positions,
                        learned_positions=config.positions == "learned", dropout=config.dropout,
                        pad_id=PAD_ID, position_layout=config.position_layout)

    settings = LayerSettings(d_model=config.d_model, heads=config.heads, ffn_dim=config.ffn_dim,
                             dropout=config.dropout, attention_dropout=config.attention_dropout,
                             ffn_dropout=config.ffn_dropout, pre_norm=config.norm == "pre",
                             scaled=config.scale_attention, activation=config.activation)
    encoder = TransformerEncoder(embedder(src_vocab_size), config.encoder_layers, settings)
    decoder = TransformerDecoder(embedder(tgt_vocab_size), config.decoder_layers, settings)
    for module in (*encoder.layers, *decoder.layers):      # Glorot init, as in the paper's code
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight)
    return encoder, decoder


def _build_rnn(config: ModelConfig, src_vocab_size: int, tgt_vocab_size: int):
    encoder = RNNEncoder(vocab_size=src_vocab_size, embed_dim=config.embed_dim,
                         hidden_dim=config.hidden_dim, layers=config.encoder_layers,
                         cell=config.cell, bidirectional=config.bidirectional,
                         dropout=config.dropout, pad_id=PAD_ID)
    shared = dict(vocab_size=tgt_vocab_size, embed_dim=config.embed_dim,
                  hidden_dim=config.hidden_dim, layers=config.decoder_layers, cell=config.cell,
                  encoder_dim=encoder.output_dim, dropout=config.dropout, pad_id=PAD_ID)
    if config.decoder == "none":
        return encoder, PlainDecoder(**shared)
    attention = build_rnn_attention(config.attention, config.local_window, config.hidden_dim,
                                    encoder.output_dim, config.attention_dim, config.max_source_len)
    if config.decoder == "bahdanau":
        return encoder, BahdanauDecoder(**shared, attention=attention)
    return encoder, LuongDecoder(**shared, attention=attention, input_feeding=config.input_feeding)


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
