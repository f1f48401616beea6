"""Decoding: greedy, beam and sampling search, model-agnostic through ``decode_step`` and
``index_select``.

Search never looks at the model type: it encodes once, feeds the previous tokens to
``model.decode_step`` and reorders ``state`` and ``memory`` with ``index_select``.
Sentences that finish leave the batch, so the remaining ones decode faster.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.decoding import Hypothesis, Sampling, output_limit


def max_output_lengths(src_mask: torch.Tensor, a: float, b: int,
                       longest: int | None = None) -> torch.Tensor:
    """``(B,)`` maximum output lengths: :func:`attnmt.decoding.output_limit` of each source."""
    source_lengths = (src_mask.sum(-1).squeeze(1) - 1).tolist()
    return torch.tensor([output_limit(length, a, b, longest) for length in source_lengths])


@torch.no_grad()
def greedy_search(model, src: torch.Tensor, src_mask: torch.Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10, min_len: int = 0, need_attention: bool = False,
                  prefixes: list[list[int]] | None = None, longest: int | None = None
                  ) -> list[Hypothesis]:
    """Argmax at each step, feeding the output back in. One hypothesis per source sentence.

    ``src (B, S)``, ``src_mask (B, 1, S)``. A sentence stops at EOS, which is forced at its
    maximum length (``max_len_a * source length + max_len_b`` tokens, EOS included, at most
    ``longest``: the model's positions). ``prefixes``: per sentence, the output tokens it
    must start with (see :func:`force_prefix`).
    """
    return _one_path(model, src, src_mask, (max_len_a, max_len_b, longest), min_len,
                     need_attention, lambda log_probs, rows, step: log_probs.argmax(dim=-1),
                     prefixes)


def sampling_distribution(log_probs: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """``log_probs (N, V)`` -> the probabilities to sample from ``(N, V)``, rows summing to 1.

    In float32, the best token shifted to 0 before dividing by the temperature, so that a
    temperature down to :data:`attnmt.decoding.MIN_TEMPERATURE` leaves it finite."""
    log_probs = log_probs.float()
    best = log_probs.max(dim=-1, keepdim=True).values
    probs = torch.softmax((log_probs - best) / sampling.temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if sampling.top_k:
        keep[:, sampling.top_k:] = False
    if sampling.top_p < 1.0:                # keep a token while the mass before it is below p
        keep &= (sorted_probs.cumsum(dim=-1) - sorted_probs) < sampling.top_p
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return kept / kept.sum(dim=-1, keepdim=True)


@torch.no_grad()
def sample_search(model, src: torch.Tensor, src_mask: torch.Tensor, sampling: Sampling = Sampling(),
                  samples: int = 1, max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0,
                  need_attention: bool = False, prefixes: list[list[int]] | None = None,
                  longest: int | None = None) -> list[list[Hypothesis]]:
    """``samples`` outputs per source sentence, drawn token by token from
    :func:`sampling_distribution`; each sentence's list is sorted by log-probability.

    The random numbers of a sample depend only on ``sampling.seed``, the sentence's source
    tokens and the sample's number, so a sentence gets the same samples alone or in any
    batch. ``score`` and ``log_prob`` are the model's own (untempered) log-probability.
    """
    batch = src.size(0)
    rows = torch.arange(batch, device=src.device).repeat_interleave(samples)
    src, src_mask = src.index_select(0, rows), src_mask.index_select(0, rows)
    generators = [_generator(sampling.seed, source, number % samples)
                  for number, source in enumerate(src.tolist())]

    def pick(log_probs: torch.Tensor, rows: list[int], step: int) -> torch.Tensor:
        probs = sampling_distribution(log_probs, sampling)
        uniform = torch.tensor([generators[row].random() for row in rows], dtype=probs.dtype,
                               device=probs.device)
        cumulative = probs.cumsum(dim=-1)
        chosen = torch.searchsorted(cumulative, (uniform * cumulative[:, -1]).unsqueeze(1),
                                    right=True)      # the first token whose mass passes u
        return chosen.squeeze(1).clamp_max(probs.size(-1) - 1)

    if prefixes is not None:
        prefixes = [prefix for prefix in prefixes for _ in range(samples)]
    found = _one_path(model, src, src_mask, (max_len_a, max_len_b, longest), min_len,
                      need_attention, pick, prefixes)
    return [sorted(found[i * samples:(i + 1) * samples], key=lambda h: -h.log_prob)
            for i in range(batch)]


def _generator(seed: int, source: list[int], number: int) -> np.random.Generator:
    """The random stream of one sample of one source sentence (padding not included)."""
    tokens = np.asarray([token for token in source if token != PAD_ID], dtype=np.int64)
    return np.random.default_rng([seed, zlib.crc32(tokens.tobytes()), number])


def _one_path(model, src, src_mask, length_rule, min_len, need_attention,
              pick, prefixes=None) -> list[Hypothesis]:
    """Decode one output per row, choosing each token with ``pick(log_probs (N, V), original
    rows, step) -> (N,)``; ``length_rule``: ``(a, b, longest)`` of :func:`max_output_lengths`.
    Ended rows leave the batch once they are a quarter of it, not one by one: every batch
    size is a new matrix shape, and bf16 kernels are built per shape."""
    memory = model.encode(src, src_mask)
    limits = max_output_lengths(src_mask, *length_rule)
    batch = src.size(0)
    rows = torch.arange(batch)                         # original row of each current row
    done = torch.zeros(batch, dtype=torch.bool)        # rows whose sentence has ended
    prev = torch.full((batch,), BOS_ID, dtype=torch.long, device=src.device)
    tokens, log_probs_sum = [[] for _ in range(batch)], [0.0] * batch
    attention = [[] for _ in range(batch)]
    state = None
    for step in range(int(limits.max())):
        log_probs, state, step_attention = model.decode_step(prev, state, memory, need_attention)
        log_probs = _constrain(log_probs.unsqueeze(1), step, min_len, limits[rows].tolist())
        if prefixes is not None:
            log_probs = force_prefix(log_probs, step, [prefixes[row] for row in rows.tolist()])
        log_probs = log_probs.squeeze(1)
        chosen = pick(log_probs, rows.tolist(), step)
        chosen_log_probs = log_probs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        step_tokens, step_log_probs = chosen.tolist(), chosen_log_probs.tolist()
        for row, (original, ended) in enumerate(zip(rows.tolist(), done.tolist())):
            if ended:
                continue
            log_probs_sum[original] += step_log_probs[row]
            if step_tokens[row] != EOS_ID:
                tokens[original].append(step_tokens[row])
            if step_attention is not None:
                attention[original].append(step_attention[row].float().cpu())
        done |= (chosen == EOS_ID).cpu()
        if done.all():
            break
        if 4 * int(done.sum()) >= len(rows):
            keep = (~done).nonzero().squeeze(1)
            on_device = keep.to(src.device)
            state, memory = state.index_select(on_device), memory.index_select(on_device)
            rows, chosen, done = rows[keep], chosen[on_device], done[keep]
        prev = chosen
    return [Hypothesis(tokens[i], log_probs_sum[i], log_probs_sum[i],
                       torch.stack(attention[i]) if attention[i] else None) for i in range(batch)]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + |y|) / 6) ** alpha`` (Wu et al. 2016); 1 when alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


def top_candidates(cumulative: torch.Tensor, log_probs: torch.Tensor, count: int):
    """Top-k selection over every (beam, token) extension.

    ``cumulative (N, K)`` beam scores, ``log_probs (N, K, V)`` -> the best ``count`` of the
    ``K x V`` extensions per sentence: ``(scores, beam indices, tokens)``, each ``(N, count)``.
    The best ``count`` overall are among each beam's best ``count``, so those are taken
    first: the ``K x V`` sums are never formed.
    """
    per_beam = min(count, log_probs.size(-1))
    beam_scores, beam_tokens = log_probs.topk(per_beam, dim=-1)             # (N, K, c)
    flat = (cumulative.unsqueeze(-1) + beam_scores).flatten(1)               # (N, K * c)
    scores, indices = flat.topk(min(count, flat.size(1)), dim=1)
    return scores, indices // per_beam, beam_tokens.flatten(1).gather(1, indices)


@dataclass
class _Beams:
    """The live hypotheses of every sentence still searching, K rows per sentence."""
    sentences: list[int]                  # original index of each live sentence, in row order
    cumulative: torch.Tensor              # (N, K) summed log-probabilities
    history: torch.Tensor                 # (N * K, t) tokens so far (N rows at the first step)


class _AttentionSteps:
    """The attention of every step, kept once: ``maps[t]`` is ``(rows at step t, ...)`` and
    ``parents[t]`` the row of step t that each row of step t + 1 extends. A hypothesis's
    attention is read back along its parents when it is returned, so the search never
    copies a growing history (which cost beam x length^2 maps per sentence)."""

    def __init__(self):
        self.maps: list[torch.Tensor] = []
        self.parents: list[torch.Tensor] = []

    def of(self, step: int, row: int) -> torch.Tensor:
        """``(step + 1, ...)``: the attention of the hypothesis in ``row`` at ``step``."""
        maps = []
        for t in range(step, -1, -1):
            maps.append(self.maps[t][row])
            if t:
                row = int(self.parents[t - 1][row])
        return torch.stack(maps[::-1]).cpu()


@dataclass
class _Finished:
    hypothesis: Hypothesis
    step: int                             # where its attention ends (see _AttentionSteps.of)
    row: int


@torch.no_grad()
def beam_search(model, src: torch.Tensor, src_mask: torch.Tensor, beam: int = 5, alpha: float = 0.6,
                max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0, n_best: int = 1,
                need_attention: bool = False, prefixes: list[list[int]] | None = None,
                trace: list[list[dict]] | None = None,
                longest: int | None = None) -> list[list[Hypothesis]]:
    """Beam search batched over sentences and beams; the ``n_best`` best hypotheses per sentence.

    Hypotheses are ranked by ``log P(y|x) / length_penalty(|y|, alpha)``, ``|y|`` counting
    EOS. A sentence stops searching once ``n_best`` hypotheses are finished and no live
    one can beat them any more (its log-probability can only fall, and the penalty is at
    most that of the maximum length); then its rows leave the batch. Only the ``n_best``
    best finished hypotheses are kept as it goes. Outputs are at most ``longest`` tokens
    (the model's positions) and :func:`max_output_lengths`.

    ``prefixes``: per sentence, the output tokens every hypothesis starts with.
    ``trace``: one empty list per sentence, filled with a dict per step of its search
    (:func:`_advance` says what it holds), to show the search as a tree.
    """
    batch, k = src.size(0), beam
    memory = model.encode(src, src_mask)
    limits = max_output_lengths(src_mask, max_len_a, max_len_b, longest).tolist()
    # The first step has one live beam per sentence: it runs on the sentences alone (width
    # 1), and state and memory are tiled to k rows per sentence afterwards.
    width = 1
    beams = _Beams(list(range(batch)), torch.zeros(batch, 1, device=src.device),
                   torch.empty(batch, 0, dtype=torch.long, device=src.device))
    attention_steps = _AttentionSteps()
    finished: list[list[_Finished]] = [[] for _ in range(batch)]
    prev = torch.full((batch,), BOS_ID, dtype=torch.long, device=src.device)
    state = None
    for step in range(max(limits)):
        log_probs, state, attention = model.decode_step(prev, state, memory, need_attention)
        log_probs = _constrain(log_probs.view(len(beams.sentences), width, -1), step, min_len,
                               [limits[s] for s in beams.sentences])
        if prefixes is not None:
            log_probs = force_prefix(log_probs, step, [prefixes[s] for s in beams.sentences])
        if attention is not None:
            attention_steps.maps.append(attention.float())
        scores, origins, tokens = top_candidates(beams.cumulative, log_probs, 2 * k)
        rows, next_tokens, next_scores, keep = _advance(beams, scores, origins, tokens, step, k,
                                                        width, alpha, limits, n_best, finished,
                                                        trace)
        if not keep:
            break
        rows = torch.tensor(rows, device=src.device)
        attention_steps.parents.append(rows)
        state = state.index_select(rows)
        if width == 1 or len(keep) < len(beams.sentences):     # tile, or drop finished sentences
            first_rows = torch.tensor(keep, device=src.device) * width    # a sentence's rows are equal
            memory = memory.index_select(first_rows.repeat_interleave(k))
        width = k
        prev = torch.tensor(next_tokens, device=src.device)
        beams = _Beams([beams.sentences[i] for i in keep],
                       torch.tensor(next_scores, device=src.device).view(len(keep), k),
                       torch.cat([beams.history[rows], prev.unsqueeze(1)], dim=1))
    for ended in finished:
        for item in ended:
            if attention_steps.maps:
                item.hypothesis.attention = attention_steps.of(item.step, item.row)
    return [[item.hypothesis for item in ended] for ended in finished]


def _constrain(log_probs: torch.Tensor, step: int, min_len: int, limits: list[int]) -> torch.Tensor:
    """No EOS before ``min_len`` tokens; only EOS at a sentence's maximum length (the maximum
    wins where the two meet), where it ends a hypothesis the limit cut: it is forced, not the
    model's choice, and adds nothing to the score, as CTranslate2 (which stops there) and
    transformers (``forced_eos_token_id``) count it. ``log_probs (N, K, V)``, ``limits`` one
    per sentence."""
    at_limit = torch.tensor([step + 1 >= limit for limit in limits], device=log_probs.device)
    if step < min_len:
        log_probs[~at_limit, :, EOS_ID] = float("-inf")
    if at_limit.any():
        only_eos = torch.full_like(log_probs[0], float("-inf"))
        only_eos[:, EOS_ID] = 0.0
        log_probs[at_limit] = only_eos
    return log_probs


def _advance(beams: _Beams, scores, origins, tokens, step, k, width, alpha, limits, n_best,
             finished, trace=None):
    """Finish EOS candidates, keep the best ``k`` others per sentence, decide who goes on.

    ``width`` is the number of rows per sentence at this step (1 at the first). Returns the
    rows to continue from, their new tokens and scores, and the positions (in
    ``beams.sentences``) of the sentences still searching. With ``trace``, each sentence's
    list gets ``{"step", "kept", "pruned", "finished"}``: the extensions kept, those left
    out among the ``2k`` best, and the hypotheses finished at this step, each as
    ``(tokens, score)`` (a finished one's score length-normalised, as it is ranked).
    ``finished`` keeps each sentence's ``n_best`` best, best first.
    """
    rows, next_tokens, next_scores, keep = [], [], [], []
    scores, origins, tokens = scores.tolist(), origins.tolist(), tokens.tolist()
    for i, sentence in enumerate(beams.sentences):
        live, pruned, ended = [], [], []
        for rank, (score, origin, token) in enumerate(zip(scores[i], origins[i], tokens[i])):
            if score == float("-inf"):
                break
            row = i * width + origin
            if len(live) == k or (token == EOS_ID and rank >= k):     # an EOS must rank within k
                pruned.append((row, token, score))
            elif token == EOS_ID:
                ended.append(_finished(beams, row, score, step, alpha))
            else:
                live.append((row, token, score))
        finished[sentence] = sorted(finished[sentence] + ended,
                                    key=lambda item: -item.hypothesis.score)[:n_best]
        if trace is not None:
            trace[sentence].append(_trace_step(beams, step, live, pruned, ended))
        if live and not _sentence_done(finished[sentence], live[0][2], limits[sentence], alpha,
                                       n_best):
            live += [(live[0][0], EOS_ID, float("-inf"))] * (k - len(live))   # pad dead beams
            keep.append(i)
            for row, token, score in live:
                rows.append(row)
                next_tokens.append(token)
                next_scores.append(score)
    return rows, next_tokens, next_scores, keep


def _trace_step(beams: _Beams, step: int, live, pruned, ended) -> dict:
    def extension(row, token, score):
        return beams.history[row].tolist() + [token], score

    return {"step": step, "kept": [extension(*candidate) for candidate in live],
            "pruned": [extension(*candidate) for candidate in pruned],
            "finished": [(item.hypothesis.tokens, item.hypothesis.score) for item in ended]}


def force_prefix(log_probs: torch.Tensor, step: int, prefixes: list[list[int]]) -> torch.Tensor:
    """Only the prefix's token at ``step`` for the sentences whose prefix is that long.
    ``log_probs (N, K, V)``, ``prefixes`` one per sentence; the forced token keeps its
    log-probability, so a prefixed hypothesis scores what the model gives its tokens."""
    forced = [(i, prefix[step]) for i, prefix in enumerate(prefixes) if step < len(prefix)]
    if not forced:
        return log_probs
    rows = torch.tensor([i for i, _ in forced], device=log_probs.device)
    wanted = torch.tensor([token for _, token in forced], device=log_probs.device)
    kept = log_probs[rows, :, wanted]                                     # (F, K)
    log_probs[rows] = float("-inf")
    log_probs[rows, :, wanted] = kept
    return log_probs


def _finished(beams: _Beams, row: int, score: float, step: int, alpha: float) -> _Finished:
    return _Finished(Hypothesis(beams.history[row].tolist(), score / length_penalty(step + 1, alpha),
                                score), step, row)


def _sentence_done(finished: list[_Finished], best_live: float, limit: int, alpha: float,
                   n_best: int) -> bool:
    """Done when n_best hypotheses are finished (best first) and the best live one cannot
    overtake them."""
    if len(finished) < n_best:
        return False
    return best_live / length_penalty(limit, alpha) <= finished[n_best - 1].hypothesis.score
