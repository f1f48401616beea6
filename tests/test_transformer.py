import math

import pytest
import torch

from attnmt.masks import causal_mask, padding_mask
from attnmt.transformer import DecoderLayer, EncoderLayer, LayerSettings, sinusoidal_table

D, H, FFN = 16, 4, 32


def test_sinusoidal_table_follows_the_formula():
    table = sinusoidal_table(50, D)
    for pos in (0, 7, 49):
        for i in range(D // 2):
            angle = pos / 10000 ** (2 * i / D)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def copy_attention(ours, theirs):
    q, k, v = theirs.in_proj_weight.chunk(3)
    qb, kb, vb = theirs.in_proj_bias.chunk(3)
    for layer, weight, bias in ((ours.q_proj, q, qb), (ours.k_proj, k, kb), (ours.v_proj, v, vb),
                                (ours.out_proj, theirs.out_proj.weight, theirs.out_proj.bias)):
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)


def settings(pre_norm: bool) -> LayerSettings:
    return LayerSettings(d_model=D, heads=H, ffn_dim=FFN, dropout=0.0, attention_dropout=0.0,
                         ffn_dropout=0.0, pre_norm=pre_norm)


def copy_common(ours, theirs, norms):
    ours.ffn.net[0].load_state_dict(theirs.linear1.state_dict())
    ours.ffn.net[3].load_state_dict(theirs.linear2.state_dict())
    for our_norm, their_norm in zip(norms, (theirs.norm1, theirs.norm2, getattr(theirs, "norm3", None))):
        our_norm.norm.load_state_dict(their_norm.state_dict())


@pytest.mark.parametrize("pre_norm", [False, True])
def test_encoder_layer_matches_torch(pre_norm):
    torch.manual_seed(0)
    ours = EncoderLayer(settings(pre_norm)).eval()
    theirs = torch.nn.TransformerEncoderLayer(D, H, FFN, dropout=0.0, batch_first=True,
                                              norm_first=pre_norm).eval()
    with torch.no_grad():
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_common(ours, theirs, (ours.attn_norm, ours.ffn_norm))
    x = torch.randn(2, 5, D)
    mask = padding_mask(torch.tensor([5, 3]), max_len=5)
    out, weights = ours(x, mask, need_weights=True)
    expected = theirs(x, src_key_padding_mask=~mask[:, 0])
    real = mask[:, 0]
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, H, 5, 5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decoder_layer_matches_torch(pre_norm):
    torch.manual_seed(0)
    ours = DecoderLayer(settings(pre_norm)).eval()
    theirs = torch.nn.TransformerDecoderLayer(D, H, FFN, dropout=0.0, batch_first=True,
                                              norm_first=pre_norm).eval()
    with torch.no_grad():
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        copy_common(ours, theirs, (ours.self_norm, ours.cross_norm, ours.ffn_norm))
    x, memory = torch.randn(2, 4, D), torch.randn(2, 6, D)
    memory_mask = padding_mask(torch.tensor([6, 2]), max_len=6)
    cross_kv = ours.cross_attn.project_kv(memory, memory)
    out, cache, _, cross = ours(x, causal_mask(4), cross_kv, memory_mask, need_weights=True)
    expected = theirs(x, memory, tgt_mask=~causal_mask(4)[0], memory_key_padding_mask=~memory_mask[:, 0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert cache is None and cross.shape == (2, H, 4, 6)
