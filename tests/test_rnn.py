import pytest
import torch
from safetensors.torch import load_file, save_file

from attnmt.checkpoint import load_weights, save_weights
from attnmt.data import BOS_ID
from attnmt.errors import UserError
from attnmt.masks import padding_mask
from attnmt.rnn import RNNEncoder

from conftest import make_model, toy_batch


def test_bidirectional_encoder_concatenates_directions_and_ignores_padding():
    torch.manual_seed(0)
    encoder = RNNEncoder(vocab_size=11, embed_dim=8, hidden_dim=6, layers=2, cell="gru",
                         bidirectional=True, dropout=0.0, pad_id=0)
    src = torch.tensor([[5, 6, 7, 2], [5, 6, 2, 0]])
    encoded = encoder(src, padding_mask(src, 0))
    assert encoded.states.shape == (2, 4, 12) and encoder.output_dim == 12
    # Forward half of the final state = forward state at the last real token; backward half =
    # backward state at the first token: padding never entered either.
    torch.testing.assert_close(encoded.final_hidden[1, :6], encoded.states[1, 2, :6])
    torch.testing.assert_close(encoded.final_hidden[1, 6:], encoded.states[1, 0, 6:])
    assert (encoded.states[1, 3] == 0).all()
    alone = encoder(src[1:, :3], padding_mask(src[1:, :3], 0))
    torch.testing.assert_close(alone.states[0], encoded.states[1, :3], atol=1e-6, rtol=1e-6)


def test_lstm_encoder_returns_cell_state():
    encoder = RNNEncoder(vocab_size=11, embed_dim=8, hidden_dim=6, layers=1, cell="lstm",
                         bidirectional=False, dropout=0.0, pad_id=0)
    src = torch.tensor([[5, 6, 2]])
    encoded = encoder(src, padding_mask(src, 0))
    assert encoded.final_cell.shape == (1, 6)


def test_embedding_weights_are_n01_over_dim_and_read_at_sqrt_dim():
    torch.manual_seed(0)
    encoder = RNNEncoder(vocab_size=4000, embed_dim=64, hidden_dim=6, layers=1, cell="gru",
                         bidirectional=False, dropout=0.0, pad_id=0)
    weight = encoder.embedding.weight
    assert (weight[0] == 0).all()                                     # padding row
    assert abs(weight[1:].std().item() - 64 ** -0.5) < 0.002          # N(0, 1/dim)
    tokens = torch.tensor([[3, 0, 7], [9, 9, 1]])
    torch.testing.assert_close(encoder.embedding(tokens), weight[tokens] * 8.0)


def test_rnn_weights_saved_without_the_embedding_scale_fail_to_load(tmp_path):
    model = make_model("luong-general")
    path = tmp_path / "older.safetensors"
    save_weights(model, path)
    save_file({name: tensor for name, tensor in load_file(str(path)).items()
               if not name.endswith("embedding.scale")}, str(path))
    with pytest.raises(UserError, match=f"{path} is not a valid checkpoint for this model .*scale"):
        load_weights(model, path)


def first_step_attention(name, first_token):
    model = make_model(name)
    src, src_mask, _, _ = toy_batch()
    with torch.no_grad():
        _, _, attention = model.decode_step(torch.full((3,), first_token), None,
                                            model.encode(src, src_mask))
    return attention


def test_bahdanau_scores_from_previous_state_luong_from_current():
    # Bahdanau's first attention reads s_0 only, so the first input token cannot change it;
    # Luong's reads s_1, which has already consumed that token.
    torch.testing.assert_close(first_step_attention("bahdanau-additive", BOS_ID),
                               first_step_attention("bahdanau-additive", 7))
    assert not torch.allclose(first_step_attention("luong-general", BOS_ID),
                              first_step_attention("luong-general", 7))


def test_no_attention_decoder_sees_source_only_through_initial_state():
    model = make_model("rnn-none-gru")
    src, src_mask, _, _ = toy_batch()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        log_probs, _, _ = model.decode_step(torch.full((3,), BOS_ID), None, memory)
        memory.states.normal_()                    # scramble every encoder state but the bridge's
        again, _, _ = model.decode_step(torch.full((3,), BOS_ID), None, memory)
    torch.testing.assert_close(log_probs, again)


def test_local_attention_decoder_zero_outside_window():
    attention = first_step_attention("luong-local-general", BOS_ID)
    nonzero = (attention > 0).sum(-1)
    assert (nonzero <= 2 * 2 + 1).all()                     # local_window 2 in conftest


# --- independent references for the RNN decoders ------------------------------------------------
# Teacher forcing (`forward`) is a loop over the same `step` as incremental decoding, so
# comparing the two cannot catch a wrong step. These references compute the decoders from
# their equations with the models' own weights.

def gru_cell(x, h, rnn):
    """One GRU step from its equations (r, z gates, candidate n), layer 0 of ``rnn``."""
    gi = x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0
    gh = h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def lstm_cell(x, h, c, rnn):
    """One LSTM step from its equations (input, forget, cell, output gates)."""
    gates = x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0 + h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0
    i, f, g, o = gates.chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def softmax_over_source(scores, src_mask):
    return torch.softmax(scores.masked_fill(~src_mask[:, 0], float("-inf")), dim=-1)


def one_layer(name, **changes):
    from attnmt.config import ModelConfig
    from attnmt.model import build_model
    from conftest import ARCHITECTURES, VOCAB

    torch.manual_seed(0)
    config = ModelConfig(**{**ARCHITECTURES[name], "encoder_layers": 1, "decoder_layers": 1, **changes})
    return build_model(config, VOCAB, VOCAB).eval()


def test_no_attention_decoder_equals_a_whole_sequence_gru():
    model = one_layer("rnn-none-gru")
    src, src_mask, tgt, tgt_mask = toy_batch()
    decoder = model.decoder
    with torch.no_grad():
        encoded = model.encoder(src, src_mask)
        h0 = torch.tanh(decoder.bridge(encoded.final_hidden)).unsqueeze(0)     # s_0 = tanh(W_b h)
        reference = torch.nn.GRU(16, 16, batch_first=True)
        reference.load_state_dict(decoder.rnn.state_dict())               # the same weights
        states, _ = reference(decoder.embedding(tgt), h0)                  # all steps at once
        expected = torch.log_softmax(model.generator(states), -1)
        ours = torch.log_softmax(model(src, src_mask, tgt, tgt_mask), -1)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_bahdanau_decoder_equals_its_equations():
    model = one_layer("bahdanau-additive")
    src, src_mask, tgt, tgt_mask = toy_batch()
    decoder, attention = model.decoder, model.decoder.attention
    with torch.no_grad():
        encoded = model.encoder(src, src_mask)
        h = encoded.states                                                 # (B, S, 2H)
        s = torch.tanh(decoder.bridge(encoded.final_hidden))              # s_0
        expected = []
        for t in range(tgt.size(1)):
            y = decoder.embedding(tgt[:, t])                               # y_{i-1}
            e = attention.energy(torch.tanh(attention.key_layer(h)
                                            + attention.query_layer(s).unsqueeze(1))).squeeze(-1)
            alpha = softmax_over_source(e, src_mask)                       # from s_{i-1}
            c = (alpha.unsqueeze(-1) * h).sum(1)                           # c_i
            s = gru_cell(torch.cat([y, c], -1), s, decoder.rnn)            # s_i = f(s_{i-1}, y, c)
            pieces = decoder.readout(torch.cat([s, y, c], -1))             # U s + V y + C c
            maxout = pieces.view(pieces.size(0), -1, 2).amax(-1)
            expected.append(torch.log_softmax(model.generator(maxout), -1))
        ours = torch.log_softmax(model(src, src_mask, tgt, tgt_mask), -1)
    torch.testing.assert_close(ours, torch.stack(expected, 1), atol=1e-5, rtol=1e-5)


def test_luong_decoder_equals_its_equations():
    model = one_layer("luong-general", cell="lstm")
    src, src_mask, tgt, tgt_mask = toy_batch()
    decoder, attention = model.decoder, model.decoder.attention
    with torch.no_grad():
        encoded = model.encoder(src, src_mask)
        h = encoded.states
        s = torch.tanh(decoder.bridge(encoded.final_hidden))
        cell = torch.tanh(decoder.cell_bridge(encoded.final_cell))
        feed = torch.zeros_like(s)                                         # h~_0
        expected = []
        for t in range(tgt.size(1)):
            x = torch.cat([decoder.embedding(tgt[:, t]), feed], -1)       # input feeding
            s, cell = lstm_cell(x, s, cell, decoder.rnn)                   # s_t
            e = torch.einsum("bd,bsd->bs", s, attention.key_to_query(h))   # s_t^T W h_j
            alpha = softmax_over_source(e, src_mask)
            c = (alpha.unsqueeze(-1) * h).sum(1)
            feed = torch.tanh(decoder.combine(torch.cat([c, s], -1)))     # h~_t = tanh(W_c[c; s])
            expected.append(torch.log_softmax(model.generator(feed), -1))
        ours = torch.log_softmax(model(src, src_mask, tgt, tgt_mask), -1)
    torch.testing.assert_close(ours, torch.stack(expected, 1), atol=1e-5, rtol=1e-5)
