import itertools
import math
from dataclasses import dataclass

import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model
from attnmt.errors import UserError
from attnmt.search import (Sampling, beam_search, greedy_search, length_penalty, sample_search,
                           sampling_distribution, top_candidates)

from conftest import SMALL_TRANSFORMER, VOCAB, make_model, toy_batch

SEARCH_ARCHS = ["transformer-post", "bahdanau-additive", "luong-general", "rnn-none-gru"]


@pytest.mark.parametrize("name", ["transformer", "rnn"])
def test_beam_of_one_equals_greedy_on_trained_models(tiny_runs, name):
    # Trained models end their outputs with EOS well before the length limit, so this runs
    # the EOS and early-stop paths, which untrained models (below) seldom reach.
    from attnmt.data.tensors import source_tensor
    from attnmt.data.numbers import numbers_corpus
    from attnmt.translator import Translator

    translator = Translator.from_run(tiny_runs[name])
    sources = numbers_corpus("test", "de", "en", 999, {"train": 0, "valid": 0, "test": 40}, 3).source
    src, src_mask = source_tensor(translator.source_tokenizer.encode_batch(sources))
    greedy = greedy_search(translator.model, src, src_mask, max_len_a=2.0, max_len_b=5)
    beam = beam_search(translator.model, src, src_mask, beam=1, alpha=0.0, max_len_a=2.0, max_len_b=5)
    limits = (src_mask.sum(-1).squeeze(1) - 1) * 2 + 5
    ended_early = [len(g.tokens) + 1 < limit for g, limit in zip(greedy, limits.tolist())]
    assert sum(ended_early) >= 30, "the outputs should end with EOS, not at the limit"
    for g, (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("arch_name", SEARCH_ARCHS)
def test_beam_of_one_equals_greedy(arch_name):
    model = make_model(arch_name)
    src, src_mask, _, _ = toy_batch()
    greedy = greedy_search(model, src, src_mask, max_len_a=1.0, max_len_b=4)
    beam = beam_search(model, src, src_mask, beam=1, alpha=0.0, max_len_a=1.0, max_len_b=4)
    for g, (b,) in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-5)


@pytest.mark.parametrize("arch_name", SEARCH_ARCHS)
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_sentence_alone_equals_sentence_in_batch(arch_name, search):
    model = make_model(arch_name)
    src, src_mask, _, _ = toy_batch()

    def run(s, m):
        if search == "greedy":
            return greedy_search(model, s, m, max_len_a=1.0, max_len_b=5)
        return [hyps[0] for hyps in beam_search(model, s, m, beam=4, alpha=0.6, max_len_a=1.0,
                                                max_len_b=5)]

    batched = run(src, src_mask)
    for row in range(src.size(0)):
        alone_src = src[row:row + 1, :int(src_mask[row].sum())]
        (alone,) = run(alone_src, padding_mask(alone_src, PAD_ID))
        assert alone.tokens == batched[row].tokens
        assert alone.score == pytest.approx(batched[row].score, abs=1e-5)


@dataclass
class PrefixState:
    prefix: torch.Tensor                       # (B, t) every token so far

    def index_select(self, index):
        return PrefixState(self.prefix.index_select(0, index))


@dataclass
class SourceMemory:
    src: torch.Tensor
    mask: torch.Tensor

    def index_select(self, index):
        return SourceMemory(self.src.index_select(0, index), self.mask.index_select(0, index))


class Recomputing:
    """The same model, decoding without any cache: the whole prefix again at every step."""

    def __init__(self, model):
        self.model = model

    def encode(self, src, src_mask):
        return SourceMemory(src, src_mask)

    def decode_step(self, prev_tokens, state, memory, need_attention=True):
        prefix = prev_tokens.unsqueeze(1) if state is None else \
            torch.cat([state.prefix, prev_tokens.unsqueeze(1)], dim=1)
        logits = self.model(memory.src, memory.mask, prefix, target_mask(prefix, PAD_ID))
        return torch.log_softmax(logits[:, -1].float(), -1), PrefixState(prefix), None


@pytest.mark.parametrize("arch_name", ["transformer-post", "luong-general"])
def test_cached_beam_search_equals_recomputed(arch_name):
    model = make_model(arch_name)
    src, src_mask, _, _ = toy_batch()
    options = dict(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=4, n_best=3)
    cached = beam_search(model, src, src_mask, **options)
    recomputed = beam_search(Recomputing(model), src, src_mask, **options)
    for ours, reference in zip(cached, recomputed):
        assert [h.tokens for h in ours] == [h.tokens for h in reference]
        assert [h.score for h in ours] == pytest.approx([h.score for h in reference], abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_wide_beam_finds_the_exhaustive_optimum(alpha):
    torch.manual_seed(3)
    config = ModelConfig(arch="transformer", d_model=8, heads=2, ffn_dim=16, encoder_layers=1,
                         decoder_layers=1, dropout=0.0, attention_dropout=0.0)
    model = build_model(config, 5, 5).eval()
    src = torch.tensor([[3, 4, EOS_ID]])
    src_mask = padding_mask(src, PAD_ID)
    limit, vocab = 3, 5
    best_score, best_tokens = float("-inf"), None
    others = [t for t in range(vocab) if t != EOS_ID]
    for length in range(limit):                               # tokens before EOS
        for tokens in itertools.product(others, repeat=length):
            tgt = torch.tensor([[BOS_ID, *tokens]])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(src, src_mask, tgt, target_mask(tgt, -1)), -1)
            total = sum(log_probs[0, i, t].item() for i, t in enumerate(tokens))
            if length + 1 < limit:                 # at the limit EOS is forced and adds nothing
                total += log_probs[0, length, EOS_ID].item()
            score = total / length_penalty(length + 1, alpha)
            if score > best_score:
                best_score, best_tokens = score, list(tokens)
    (best,) = beam_search(model, src, src_mask, beam=vocab ** 2, alpha=alpha, max_len_a=0.0,
                          max_len_b=limit)[0]
    assert best.tokens == best_tokens
    assert best.score == pytest.approx(best_score, abs=1e-5)


A, B = 3, 4
# Hand-written next-token probabilities by prefix, over [PAD, BOS, EOS, a, b].
SCRIPT = {(): {EOS_ID: 0.1, A: 0.5, B: 0.4},
          (A,): {EOS_ID: 0.25, A: 0.35, B: 0.4},
          (B,): {EOS_ID: 0.6, A: 0.2, B: 0.2}}


class Scripted:
    def encode(self, src, src_mask):
        return SourceMemory(src, src_mask)

    def decode_step(self, prev_tokens, state, memory, need_attention=True):
        prefix = torch.empty(len(prev_tokens), 0, dtype=torch.long) if state is None else \
            torch.cat([state.prefix, prev_tokens.unsqueeze(1)], dim=1)
        log_probs = torch.full((len(prev_tokens), 5), float("-inf"))
        for row, tokens in enumerate(prefix.tolist()):
            for token, probability in SCRIPT.get(tuple(tokens), {EOS_ID: 1.0}).items():
                log_probs[row, token] = math.log(probability)
        return log_probs, PrefixState(prefix), None


def scripted_search(**options):
    src = torch.tensor([[A, EOS_ID]])
    return beam_search(Scripted(), src, padding_mask(src, PAD_ID), max_len_a=0.0, max_len_b=10,
                       **options)[0]


def test_scripted_beams_without_length_penalty():
    # Step 1: a .5, b .4 live (EOS .1 ranks third, outside the beam of 2).
    # Step 2: b+EOS .24 finishes; ab .2 and aa .175 stay live; .2 < .24, so search stops.
    (best,) = scripted_search(beam=2, alpha=0.0)
    assert best.tokens == [B] and best.log_prob == pytest.approx(math.log(0.24))
    # With two answers wanted, ab and aa finish at step 3.
    first, second = scripted_search(beam=2, alpha=0.0, n_best=2)
    assert (first.tokens, second.tokens) == ([B], [A, B])
    assert second.score == pytest.approx(math.log(0.2))


def test_scripted_beams_with_length_penalty():
    # alpha 2: b+EOS scores log .24 / (7/6)^2 = -1.0485, ab+EOS log .2 / (8/6)^2 = -0.9053,
    # aa+EOS log .175 / (8/6)^2 = -0.9803: the longer hypotheses win.
    first, second = scripted_search(beam=2, alpha=2.0, n_best=2)
    assert first.tokens == [A, B] and first.score == pytest.approx(math.log(0.2) / (8 / 6) ** 2)
    assert second.tokens == [A, A] and second.score == pytest.approx(math.log(0.175) / (8 / 6) ** 2)


def test_top_candidates_selects_over_beams_and_tokens():
    cumulative = torch.tensor([[0.0, -1.0]])
    log_probs = torch.log(torch.tensor([[[0.1, 0.9], [0.6, 0.4]]]))
    scores, beams, tokens = top_candidates(cumulative, log_probs, 3)   # -0.11, -1.51, -1.92
    assert beams.tolist() == [[0, 1, 1]] and tokens.tolist() == [[1, 0, 1]]
    assert scores[0, 0].item() == pytest.approx(math.log(0.9))


def test_min_and_max_length():
    model = make_model("transformer-post")
    src, src_mask, _, _ = toy_batch()
    # At most 3 tokens with EOS (limit 3) and no EOS before 2 tokens: exactly 2.
    for hypothesis in greedy_search(model, src, src_mask, max_len_a=0.0, max_len_b=3, min_len=2):
        assert len(hypothesis.tokens) == 2
    for (hypothesis,) in beam_search(model, src, src_mask, beam=3, max_len_a=0.0, max_len_b=3,
                                     min_len=2):
        assert len(hypothesis.tokens) == 2


def forced_attention(model, src, src_mask, tokens: list[int]) -> torch.Tensor:
    """The attention of each step when ``tokens`` + EOS are fed one by one: ``(T+1, L, H, S)``."""
    memory, state, rows = model.encode(src, src_mask), None, []
    with torch.no_grad():
        for token in [BOS_ID, *tokens]:
            _, state, attention = model.decode_step(torch.tensor([token]), state, memory)
            rows.append(attention[0])
    return torch.stack(rows)


@pytest.mark.parametrize("arch_name", ["bahdanau-additive", "transformer-post"])
def test_attention_history_belongs_to_the_hypothesis(arch_name):
    # Beams reorder at every step: the attention kept for a hypothesis must be the one its
    # own prefix produced, not a neighbour's (checked against a forced decode of its tokens).
    model = make_model(arch_name)
    src, src_mask, _, _ = toy_batch()
    layers, heads = model.attention_grid
    for row, hypotheses in enumerate(beam_search(model, src, src_mask, beam=3, n_best=3,
                                                 max_len_b=6, need_attention=True)):
        alone = src[row:row + 1, :int(src_mask[row].sum())]
        for hypothesis in hypotheses:
            expected = forced_attention(model, alone, padding_mask(alone, PAD_ID), hypothesis.tokens)
            assert hypothesis.attention.shape == (len(hypothesis.tokens) + 1, layers, heads, src.size(1))
            torch.testing.assert_close(hypothesis.attention[..., :alone.size(1)], expected,
                                       atol=1e-5, rtol=1e-5)
    greedy = greedy_search(model, src, src_mask, max_len_b=4, need_attention=True)[0]
    assert greedy.attention.shape == (len(greedy.tokens) + 1, layers, heads, src.size(1))


# --- sampling ---------------------------------------------------------------------------------

@pytest.mark.parametrize("arch_name", SEARCH_ARCHS)
def test_sampling_from_the_top_token_alone_is_greedy(arch_name):
    model = make_model(arch_name)
    src, src_mask, _, _ = toy_batch()
    greedy = greedy_search(model, src, src_mask, max_len_a=1.0, max_len_b=4)
    sampled = sample_search(model, src, src_mask, Sampling(top_k=1, seed=5), samples=2,
                            max_len_a=1.0, max_len_b=4)
    for g, samples in zip(greedy, sampled):
        assert [s.tokens for s in samples] == [g.tokens, g.tokens]
        assert samples[0].log_prob == pytest.approx(g.log_prob, abs=1e-5)


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    probs = torch.tensor([[0.0625, 0.5, 0.0625, 0.25, 0.125]])     # sums exact in binary

    def kept(p):
        return (sampling_distribution(probs.log(), Sampling(top_p=p))[0] > 0).nonzero().flatten().tolist()

    assert kept(0.5) == [1]                     # 0.5 reaches 0.5 alone
    assert kept(0.5001) == [1, 3]               # 0.75
    assert kept(0.75) == [1, 3]
    assert kept(0.7501) == [1, 3, 4]            # 0.875
    assert kept(1.0) == [0, 1, 2, 3, 4]
    torch.testing.assert_close(sampling_distribution(probs.log(), Sampling(top_p=0.75)),
                               torch.tensor([[0.0, 2 / 3, 0.0, 1 / 3, 0.0]]))
    torch.testing.assert_close(sampling_distribution(probs.log(), Sampling(top_k=2)),
                               torch.tensor([[0.0, 2 / 3, 0.0, 1 / 3, 0.0]]))
    flat = sampling_distribution(probs.log(), Sampling(temperature=1e6))
    torch.testing.assert_close(flat, torch.full((1, 5), 0.2))


def test_samples_are_repeatable_and_do_not_depend_on_the_batch():
    model = make_model("transformer-post")
    src, src_mask, _, _ = toy_batch()
    options = dict(sampling=Sampling(temperature=2.0, seed=7), samples=4, max_len_a=1.0, max_len_b=6)
    together = sample_search(model, src, src_mask, **options)
    assert [[h.tokens for h in row] for row in together] == \
        [[h.tokens for h in row] for row in sample_search(model, src, src_mask, **options)]
    assert len({tuple(h.tokens) for row in together for h in row}) > 3        # they do differ
    for row in range(3):
        alone = src[row:row + 1, :int(src_mask[row].sum())]
        (samples,) = sample_search(model, alone, padding_mask(alone, PAD_ID), **options)
        assert [h.tokens for h in samples] == [h.tokens for h in together[row]]
    other_seed = sample_search(model, src, src_mask, **{**options, "sampling": Sampling(2.0, seed=8)})
    assert [[h.tokens for h in row] for row in other_seed] != [[h.tokens for h in row] for row in together]


def test_sampled_frequencies_follow_the_scripted_probabilities():
    # First token: EOS .1, a .5, b .4; after b: EOS .6, a .2, b .2 (SCRIPT above).
    src = torch.tensor([[A, EOS_ID]])
    draws = 4000
    (samples,) = sample_search(Scripted(), src, padding_mask(src, PAD_ID), Sampling(seed=3),
                               samples=draws, max_len_a=0.0, max_len_b=3)
    counts = {}
    for sample in samples:
        counts[tuple(sample.tokens[:2])] = counts.get(tuple(sample.tokens[:2]), 0) + 1
    expected = {(): 0.1, (A, A): 0.5 * 0.35, (A, B): 0.5 * 0.4, (B,): 0.4 * 0.6, (B, A): 0.4 * 0.2,
                (B, B): 0.4 * 0.2, (A,): 0.5 * 0.25}
    for prefix, probability in expected.items():
        tolerance = 4 * math.sqrt(probability * (1 - probability) / draws)     # 4 sigma
        assert abs(counts.get(prefix, 0) / draws - probability) < tolerance, prefix
    (nucleus,) = sample_search(Scripted(), src, padding_mask(src, PAD_ID), Sampling(top_p=0.5, seed=3),
                               samples=200, max_len_a=0.0, max_len_b=3)
    assert {sample.tokens[0] for sample in nucleus} == {A}                 # a (.5) reaches .5
    assert all(s.log_prob >= t.log_prob for s, t in zip(nucleus, nucleus[1:]))


class FixedDraw:
    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


@pytest.mark.parametrize("top_p, draw, first", [(1.0, 0.0, []), (0.5, 0.0, [A]), (1.0, 0.9999, [B])])
def test_edge_draws_never_pick_a_token_without_mass(monkeypatch, top_p, draw, first):
    # The tokens below EOS have no mass, so their cumulative mass equals 0: a draw of exactly 0
    # must pass them (the first token whose mass exceeds the draw), not stop at token 0.
    monkeypatch.setattr("attnmt.search._generator", lambda *args: FixedDraw(draw))
    src = torch.tensor([[A, EOS_ID]])
    (samples,) = sample_search(Scripted(), src, padding_mask(src, PAD_ID), Sampling(top_p=top_p),
                               max_len_a=0.0, max_len_b=2)
    assert samples[0].tokens[:1] == first            # [] when EOS is drawn


def test_bad_sampling_settings_are_refused():
    for settings, message in ((dict(temperature=0.0), "temperature must be at least 1e-37"),
                              (dict(temperature=1e-300), "temperature must be at least 1e-37"),
                              (dict(top_k=-1), "top-k must be >= 0"),
                              (dict(top_p=0.0), r"top-p must be in \(0, 1\]"),
                              (dict(top_p=1.5), r"top-p must be in \(0, 1\]")):
        with pytest.raises(UserError, match=message):
            Sampling(**settings)


def test_the_smallest_temperature_samples_the_greedy_output():
    # 1e-300 was garbage ("nnnn"): every score overflowed. At the bound the best token stays
    # finite, so sampling is greedy, with a forced (unlikely) prefix token too.
    from attnmt.decoding import MIN_TEMPERATURE

    model = make_model("transformer-post")
    src, src_mask, _, _ = toy_batch()
    coldest = Sampling(temperature=MIN_TEMPERATURE, seed=5)
    greedy = greedy_search(model, src, src_mask, max_len_a=1.0, max_len_b=5)
    sampled = sample_search(model, src, src_mask, coldest, max_len_a=1.0, max_len_b=5)
    assert [s.tokens for (s,) in sampled] == [g.tokens for g in greedy]
    prefixes = [[4, 4], [5], [6]]
    forced = sample_search(model, src, src_mask, coldest, max_len_a=1.0, max_len_b=5,
                           prefixes=prefixes)
    greedy = greedy_search(model, src, src_mask, max_len_a=1.0, max_len_b=5, prefixes=prefixes)
    assert [s.tokens for (s,) in forced] == [g.tokens for g in greedy]
    assert all(math.isfinite(s.log_prob) for (s,) in forced)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_outputs_stop_at_the_model_positions(search):
    # 1.5 x 6 + 10 = 19 tokens would pass a decoder of 8 positions and fail after decoding.
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**SMALL_TRANSFORMER, "max_positions": 8}), VOCAB,
                        VOCAB).eval()
    src = torch.tensor([[4, 5, 6, 7, 8, 9, EOS_ID]])
    mask = padding_mask(src, PAD_ID)
    lengths = dict(max_len_a=1.5, max_len_b=10, longest=model.max_output_tokens)
    if search == "greedy":
        (found,) = greedy_search(model, src, mask, **lengths)
    elif search == "beam":
        ((found, *_),) = beam_search(model, src, mask, beam=3, alpha=10.0, n_best=2, **lengths)
    else:
        ((found,),) = sample_search(model, src, mask, Sampling(temperature=5.0), **lengths)
    assert model.max_output_tokens == 8 and len(found.tokens) + 1 <= 8
