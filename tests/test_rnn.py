import torch

from attnmt.data import BOS_ID
from attnmt.masks import padding_mask
from attnmt.rnn import RNNEncoder

from conftest import make_model, toy_batch


def test_bidirectional_encoder_concatenates_directions_and_ignores_padding():
    torch.manual_seed(0)
    encoder = RNNEncoder(11, 8, 6, layers=2, cell="gru", bidirectional=True, dropout=0.0, pad_id=0)
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
    encoder = RNNEncoder(11, 8, 6, layers=1, cell="lstm", bidirectional=False, dropout=0.0, pad_id=0)
    src = torch.tensor([[5, 6, 2]])
    encoded = encoder(src, padding_mask(src, 0))
    assert encoded.final_cell.shape == (1, 6)


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
    model = make_model("luong-local-general")
    src, src_mask, _, _ = toy_batch()
    attention = first_step_attention("luong-local-general", BOS_ID)
    nonzero = (attention > 0).sum(-1)
    assert (nonzero <= 2 * model.config.local_window + 1).all()
