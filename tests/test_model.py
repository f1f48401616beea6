import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.data import PAD_ID
from attnmt.data.tensors import make_batch
from attnmt.errors import UserError
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model
from attnmt.train import TrainingLoss

from conftest import ARCHITECTURES, SMALL_RNN, SMALL_TRANSFORMER, VOCAB, make_model, toy_batch


def decode_incrementally(model, src, src_mask, tgt):
    memory = model.encode(src, src_mask)
    state, steps, attentions = None, [], []
    for position in range(tgt.size(1)):
        log_probs, state, attention = model.decode_step(tgt[:, position], state, memory)
        steps.append(log_probs)
        attentions.append(attention)
    return torch.stack(steps, 1), state, memory, attentions


def test_forward_shapes(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, tgt_mask = toy_batch()
    assert model(src, src_mask, tgt, tgt_mask).shape == (3, 6, VOCAB)
    assert model.num_parameters() > 0


def test_incremental_decoding_equals_teacher_forcing(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, tgt_mask = toy_batch()
    with torch.no_grad():
        full = torch.log_softmax(model(src, src_mask, tgt, tgt_mask), -1)
        steps, _, _, _ = decode_incrementally(model, src, src_mask, tgt)
    real = tgt != PAD_ID
    torch.testing.assert_close(steps[real], full[real], atol=1e-5, rtol=1e-5)


def test_masked_source_positions_get_zero_attention(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, _ = toy_batch()
    with torch.no_grad():
        _, _, _, attentions = decode_incrementally(model, src, src_mask, tgt)
    if ARCHITECTURES[arch_name].get("decoder") == "none":
        assert all(attention is None for attention in attentions)
        return
    layers, heads = model.attention_grid
    for attention in attentions:
        assert attention.shape == (3, layers, heads, src.size(1))           # (B, L, H, S)
        padded = (~src_mask[:, 0])[:, None, None, :].expand_as(attention)
        assert (attention[padded] == 0).all()
        assert (attention >= 0).all()
        if not ARCHITECTURES[arch_name].get("local_window"):   # local-p: times a Gaussian
            torch.testing.assert_close(attention.sum(-1), torch.ones(3, layers, heads))


def test_padding_does_not_change_real_positions(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, tgt_mask = toy_batch()
    with torch.no_grad():
        batch_logits = model(src, src_mask, tgt, tgt_mask)
        for row in range(3):
            s, t = int(src_mask[row].sum()), int((tgt[row] != PAD_ID).sum())
            alone_src, alone_tgt = src[row:row + 1, :s], tgt[row:row + 1, :t]
            alone = model(alone_src, padding_mask(alone_src, PAD_ID), alone_tgt,
                          target_mask(alone_tgt, PAD_ID))
            torch.testing.assert_close(alone[0], batch_logits[row, :t], atol=1e-5, rtol=1e-5)


def test_batches_padded_to_a_multiple_give_the_same_loss_and_gradients(arch_name):
    """What ``train.pad_multiple`` relies on: the extra padding changes no number."""
    sources, targets = [[4, 5, 6, 7, 8, 9], [5, 6, 7], [8]], [[4, 5], [6, 7, 8, 9, 10], [5]]
    results = []
    for multiple in (1, 8):
        model = make_model(arch_name)
        batch = make_batch(sources, targets, [0, 1, 2], multiple)
        loss = TrainingLoss(model)(batch.src, batch.tgt_in, batch.tgt_out, 0.1)
        loss.backward()
        results.append([loss.detach()] + [torch.zeros_like(p) if p.grad is None else p.grad
                                          for p in model.parameters()])
    assert batch.src.size(1) == batch.tgt_out.size(1) == 8
    for exact, padded in zip(*results):
        torch.testing.assert_close(padded, exact)


def test_future_target_tokens_do_not_change_earlier_outputs(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, tgt_mask = toy_batch()
    changed = tgt.clone()
    changed[0, 4] = (changed[0, 4] + 1 - 4) % (VOCAB - 4) + 4
    with torch.no_grad():
        before = model(src, src_mask, tgt, tgt_mask)
        after = model(src, src_mask, changed, target_mask(changed, PAD_ID))
    torch.testing.assert_close(before[0, :4], after[0, :4], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(before[0, 4:], after[0, 4:])


def test_index_select_reorders_state_and_memory_consistently(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, _ = toy_batch()
    order = torch.tensor([2, 0, 1])
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        state = None
        for position in range(2):
            _, state, _ = model.decode_step(tgt[:, position], state, memory)
        expected, _, _ = model.decode_step(tgt[:, 2], state, memory)
        reordered, _, _ = model.decode_step(tgt[order, 2], state.index_select(order),
                                            memory.index_select(order))
    torch.testing.assert_close(reordered, expected[order], atol=1e-6, rtol=1e-6)


def test_state_index_select_can_repeat_entries(arch_name):
    model = make_model(arch_name)
    src, src_mask, tgt, _ = toy_batch()
    beams = torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        log_probs, state, _ = model.decode_step(tgt[:, 0], None, memory)
        tiled, _, _ = model.decode_step(tgt[beams, 0], None, memory.index_select(beams))
    torch.testing.assert_close(tiled, log_probs[beams], atol=1e-6, rtol=1e-6)


FAMILIES = ["transformer-post", "rnn-none-gru", "bahdanau-additive", "luong-general"]


@pytest.mark.parametrize("arch_name", FAMILIES)
def test_overfits_one_batch(arch_name):
    torch.manual_seed(0)
    config = ModelConfig(**dict(ARCHITECTURES[arch_name], tie_embeddings="none"))
    model = build_model(config, VOCAB, VOCAB).train()
    src, src_mask, tgt, _ = toy_batch()
    tgt_in, tgt_out = tgt[:, :-1], torch.cat([tgt[:, 1:-1], tgt[:, -1:]], 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        logits = model(src, src_mask, tgt_in, target_mask(tgt_in, PAD_ID))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tgt_out.reshape(-1),
                                                 ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


def test_tied_embeddings_share_one_tensor():
    model = build_model(ModelConfig(**dict(SMALL_TRANSFORMER, tie_embeddings="all")), VOCAB, VOCAB)
    assert model.generator.weight is model.decoder.embedding.weight
    assert model.encoder.embedding.weight is model.decoder.embedding.weight
    untied = build_model(ModelConfig(**dict(SMALL_TRANSFORMER, tie_embeddings="none")), VOCAB, VOCAB)
    assert untied.num_parameters() - model.num_parameters() == 2 * VOCAB * 16


def test_tie_all_needs_joint_vocabulary():
    with pytest.raises(UserError, match="joint vocabulary"):
        build_model(ModelConfig(**dict(SMALL_TRANSFORMER, tie_embeddings="all")), VOCAB, VOCAB + 1)


def test_rnn_tying_needs_matching_sizes():
    with pytest.raises(UserError, match="embed_dim = hidden_dim"):
        build_model(ModelConfig(**dict(SMALL_RNN, hidden_dim=20)), VOCAB, VOCAB)


def test_dot_attention_with_bidirectional_encoder_fails_at_build_time():
    config = ModelConfig(**dict(SMALL_RNN, decoder="luong", attention="dot"))
    with pytest.raises(UserError, match="model config: dot attention needs equal query and key "
                                        "sizes, got query 16 and key 32"):
        build_model(config, VOCAB, VOCAB)


def test_transformer_rejects_sequences_longer_than_its_positions():
    model = build_model(ModelConfig(**dict(SMALL_TRANSFORMER, max_positions=8)), VOCAB, VOCAB)
    src = torch.full((1, 9), 5)
    with pytest.raises(UserError, match="9 tokens exceeds model.max_positions"):
        model.encode(src, padding_mask(src, PAD_ID))
