import math

import pytest
import torch
import torch.nn.functional as F

from attnmt.attention import (Additive, Dot, General, KVCache, LocalAttention, Location,
                              MultiHeadAttention, ScaledDot, build_scorer, masked_softmax,
                              scaled_dot_product_attention)
from attnmt.masks import causal_mask, padding_mask

B, TQ, TK, D = 3, 4, 6, 8


def make_scorer(kind, query_dim=D, key_dim=D):
    if kind == "local":
        return LocalAttention(General(query_dim, key_dim), query_dim, half_window=2, hidden_dim=5)
    return build_scorer(kind, query_dim, key_dim, attention_dim=7, max_source_len=10)


SCORERS = ["dot", "scaled_dot", "general", "additive", "location", "local"]
LENGTHS = torch.tensor([6, 3, 1])


def inputs(dtype=torch.float32, query_dim=D, key_dim=D, value_dim=5):
    torch.manual_seed(0)
    return (torch.randn(B, TQ, query_dim, dtype=dtype), torch.randn(B, TK, key_dim, dtype=dtype),
            torch.randn(B, TK, value_dim, dtype=dtype), padding_mask(LENGTHS, max_len=TK))


@pytest.mark.parametrize("kind", SCORERS)
def test_scorer_shapes_and_masked_weights(kind):
    query, key, value, mask = inputs()
    scorer = make_scorer(kind)
    if kind != "local":
        assert scorer.score(query, key).shape == (B, TQ, TK)
    context, weights = scorer(query, key, value, mask)
    assert context.shape == (B, TQ, 5) and weights.shape == (B, TQ, TK)
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    assert (weights >= 0).all()
    if kind != "local":   # local-p multiplies the softmax by a Gaussian, as in Luong 2015
        torch.testing.assert_close(weights.sum(-1), torch.ones(B, TQ))
    else:
        assert (weights.sum(-1) <= 1 + 1e-6).all()
    torch.testing.assert_close(context, weights @ value)


def test_additive_allows_different_query_and_key_sizes():
    query, key, value, mask = inputs(query_dim=3, key_dim=9)
    context, weights = Additive(3, 9, attention_dim=4)(query, key, value, mask)
    assert context.shape == (B, TQ, 5)


@pytest.mark.parametrize("kind", ["dot", "scaled_dot"])
def test_dot_scorers_refuse_unequal_sizes(kind):
    with pytest.raises(ValueError, match="equal query and key sizes, got query 4 and key 6"):
        build_scorer(kind, 4, 6, attention_dim=8, max_source_len=10)


def test_unknown_scorer_named():
    with pytest.raises(ValueError, match="unknown attention score 'cosine'"):
        build_scorer("cosine", 4, 4, attention_dim=8, max_source_len=10)


def test_scores_match_their_equations():
    query, key, _, _ = inputs()
    torch.testing.assert_close(Dot(D, D).score(query, key), query @ key.transpose(1, 2))
    torch.testing.assert_close(ScaledDot(D, D).score(query, key),
                               query @ key.transpose(1, 2) / math.sqrt(D))
    general = General(D, D)
    weight = general.key_to_query.weight                                  # W: key -> query space
    torch.testing.assert_close(general.score(query, key),
                               torch.einsum("bqd,de,bke->bqk", query, weight, key))
    additive = Additive(D, D, attention_dim=7)
    w1, w2 = additive.key_layer.weight, additive.query_layer.weight
    v = additive.energy.weight[0]
    expected = torch.tanh((key @ w1.T).unsqueeze(1) + (query @ w2.T).unsqueeze(2)) @ v
    torch.testing.assert_close(additive.score(query, key), expected)


def test_location_depends_on_query_only_and_rejects_long_sources():
    query, key, _, _ = inputs()
    location = Location(D, max_source_len=10)
    torch.testing.assert_close(location.score(query, key), location.score(query, key * 7))
    with pytest.raises(ValueError, match="at most 10 tokens, got 12"):
        location.score(query, torch.randn(B, 12, D))


def test_local_p_attention_equals_luong_equations():
    # p_t = S sigmoid(v_p^T tanh(W_p s_t)); the general score's softmax over the real
    # positions with |j - p_t| <= D, times exp(-(j - p_t)^2 / (2 sigma^2)), sigma = D / 2.
    query, key, value, mask = inputs()
    local = make_scorer("local")
    with torch.no_grad():
        context, weights = local(query, key, value, mask)
        W_p, v_p = local.centre_hidden.weight, local.centre_out.weight      # (5, D), (1, 5)
        W = local.scorer.key_to_query.weight                                # general: s^T W h
        for b in range(B):
            S = int(LENGTHS[b])
            for t in range(TQ):
                s = query[b, t]
                p = S * torch.sigmoid(v_p @ torch.tanh(W_p @ s))            # the centre
                scores = torch.stack([s @ (W @ key[b, j]) for j in range(TK)])
                inside = torch.tensor([j < S and abs(j - p.item()) <= 2 for j in range(TK)])
                align = torch.zeros(TK)
                align[inside] = torch.softmax(scores[inside], dim=0)
                gauss = torch.exp(-(torch.arange(TK) - p) ** 2 / (2 * (2 / 2) ** 2))
                expected = align * gauss
                torch.testing.assert_close(weights[b, t], expected, atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(context[b, t], expected @ value[b], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", SCORERS)
def test_gradcheck_scorers(kind):
    query, key, value, mask = inputs(torch.float64)
    scorer = make_scorer(kind).double()
    for tensor in (query, key, value):
        tensor.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, k, v: scorer(q, k, v, mask)[0], (query, key, value))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", SCORERS)
def test_fully_masked_row_gives_zeros_not_nan(kind, dtype):
    query, key, value, mask = inputs(dtype)
    mask = mask.clone()
    mask[1] = False
    scorer = make_scorer(kind).to(dtype)
    context, weights = scorer(query, key, value, mask)
    assert not torch.isnan(context).any() and not torch.isnan(weights).any()
    assert (weights[1] == 0).all() and (context[1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_masked_softmax_fully_masked_rows(dtype):
    scores = torch.randn(2, 3, 4, dtype=dtype)
    mask = torch.tensor([[[True, False, True, False]], [[False] * 4]])
    weights = masked_softmax(scores, mask)
    assert (weights[1] == 0).all() and not torch.isnan(weights).any()
    torch.testing.assert_close(weights[0].sum(-1).float(), torch.ones(3), atol=1e-2, rtol=0)


# --- scaled_dot_product_attention ---------------------------------------------------------

def qkv(length_q, length_k, dtype=torch.float32, heads=2, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = lambda t: (2, heads, t, dim)
    return tuple(torch.randn(shape(t), generator=generator, dtype=dtype)
                 for t in (length_q, length_k, length_k))


def padded_and_causal_masks(length):
    lengths = torch.tensor([length, max(1, length - 3)])
    padding = padding_mask(lengths, max_len=length).unsqueeze(1)           # (2, 1, 1, T)
    return {"none": None, "padding": padding,
            "causal": causal_mask(length).unsqueeze(1),
            "padding+causal": padding & causal_mask(length).unsqueeze(1)}


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "padding+causal"])
def test_plain_path_matches_torch(mask_kind):
    q, k, v = qkv(7, 7)
    mask = padded_and_causal_masks(7)[mask_kind]
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 2, 7, 7)
    fused, none = scaled_dot_product_attention(q, k, v, mask, need_weights=False)
    assert none is None
    torch.testing.assert_close(fused, out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length,chunk", [(5, 2), (64, 16), (300, 64), (1000, 128), (4096, 1024)])
@pytest.mark.parametrize("mask_kind", ["none", "padding+causal"])
def test_chunked_path_equals_plain(length, chunk, mask_kind):
    q, k, v = qkv(length, length, heads=1)
    mask = padded_and_causal_masks(length)[mask_kind]
    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    chunked, weights = scaled_dot_product_attention(q, k, v, mask, chunk_size=chunk)
    assert weights is None
    torch.testing.assert_close(chunked, plain, atol=1e-5, rtol=1e-5)


def test_chunked_path_with_different_query_and_key_lengths():
    q, k, v = qkv(3, 50)
    mask = padding_mask(torch.tensor([50, 17]), max_len=50).unsqueeze(1)
    plain, _ = scaled_dot_product_attention(q, k, v, mask)
    chunked, _ = scaled_dot_product_attention(q, k, v, mask, chunk_size=8)
    torch.testing.assert_close(chunked, plain, atol=1e-5, rtol=1e-5)


def test_chunked_path_gradcheck():
    q, k, v = (t.double().requires_grad_(True) for t in qkv(5, 7, heads=1, dim=4))
    mask = padding_mask(torch.tensor([7, 4]), max_len=7).unsqueeze(1)
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, chunk_size=3)[0], (q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["plain", "chunked", "fused"])
def test_sdpa_fully_masked_rows(dtype, path):
    q, k, v = qkv(4, 6, dtype=dtype)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1] = False
    options = {"plain": {}, "chunked": {"chunk_size": 4}, "fused": {"need_weights": False}}[path]
    out, _ = scaled_dot_product_attention(q, k, v, mask, **options)
    assert not torch.isnan(out).any()
    assert (out[1] == 0).all()


# --- multi-head attention -----------------------------------------------------------------

def mha_pair(d_model=16, heads=4):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model, heads).eval()
    reference = torch.nn.MultiheadAttention(d_model, heads, batch_first=True).eval()
    with torch.no_grad():
        q_w, k_w, v_w = reference.in_proj_weight.chunk(3)
        q_b, k_b, v_b = reference.in_proj_bias.chunk(3)
        for layer, weight, bias in ((ours.q_proj, q_w, q_b), (ours.k_proj, k_w, k_b),
                                    (ours.v_proj, v_w, v_b),
                                    (ours.out_proj, reference.out_proj.weight,
                                     reference.out_proj.bias)):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
    return ours, reference


def test_multihead_matches_torch_multihead_attention():
    ours, reference = mha_pair()
    query, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = padding_mask(torch.tensor([7, 4]), max_len=7)                   # (B, 1, Tk)
    out, weights, _ = ours(query, memory, memory, mask, need_weights=True)
    expected, expected_weights = reference(query, memory, memory, key_padding_mask=~mask[:, 0],
                                           average_attn_weights=False)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (2, 4, 5, 7)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)


def test_multihead_causal_self_attention_matches_torch():
    ours, reference = mha_pair()
    x = torch.randn(2, 6, 16)
    out, _, _ = ours(x, x, x, causal_mask(6))
    expected, _ = reference(x, x, x, attn_mask=~causal_mask(6)[0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_multihead_cache_equals_full_causal_pass():
    ours, _ = mha_pair()
    x = torch.randn(2, 40, 16)                  # past the initial capacity: the cache grows
    full, _, _ = ours(x, x, x, causal_mask(40))
    cache, steps = KVCache(), []
    for t in range(40):
        step, _, cache = ours(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1], cache=cache)
        steps.append(step)
    assert cache.tensors()[0].shape == (2, 4, 40, 4)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_kv_cache_branches_do_not_overwrite_each_other():
    cache = KVCache().append(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3))
    first = cache.append(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3))
    second = cache.append(torch.full((1, 1, 1, 3), 2.0), torch.full((1, 1, 1, 3), 2.0))
    assert first.tensors()[0][0, 0, 2].tolist() == [1.0] * 3
    assert second.tensors()[0][0, 0, 2].tolist() == [2.0] * 3
    assert cache.tensors()[0].shape == (1, 1, 2, 3)
    reordered = first.index_select(torch.tensor([0, 0]))
    assert reordered.tensors()[1].shape == (2, 1, 3, 3)


def test_multihead_precomputed_cross_kv_equals_forward():
    ours, _ = mha_pair()
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    out, _, _ = ours(query, memory, memory)
    k, v = ours.project_kv(memory, memory)
    attended, _ = ours.attend(query, k, v)
    torch.testing.assert_close(attended, out)


def test_multihead_gradcheck():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).double()
    query, memory = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    mask = padding_mask(torch.tensor([4, 2]), max_len=4)
    query.requires_grad_(True)
    memory.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, m: mha(q, m, m, mask, need_weights=True)[0],
                                    (query, memory))


def test_multihead_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="d_model 10 is not divisible by heads 4"):
        MultiHeadAttention(10, 4)


@pytest.mark.parametrize("options", [{}, {"chunk_size": 3}, {"need_weights": False}])
def test_unscaled_dot_product_on_every_path(options):
    q, k, v = qkv(5, 7)
    expected = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    out, _ = scaled_dot_product_attention(q, k, v, scale=1.0, **options)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
