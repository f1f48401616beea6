"""The PyTorch engine behind :class:`attnmt.translator.Translator`: attnmt's own models and
search (greedy, beam, sampling), one run or an ensemble of runs.

An ensemble (:class:`Ensemble`) is one more model for the search: at every step it
feeds each run its own state and averages the runs' log-probabilities of the next
token, ``log p(y_t) = (1/M) sum_m log p_m(y_t | y_<t, x)``, as Marian does (fairseq
averages probabilities instead). Greedy, beam and sampling search then run unchanged.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from attnmt.data import BOS_ID
from attnmt.data.tensors import source_tensor
from attnmt.decoding import Hypothesis, SearchOptions
from attnmt.process import resolve_device, resolve_precision
from attnmt.run import RunDirectory
from attnmt.search import beam_search, greedy_search, sample_search


class Parts:
    """The memories or states of an ensemble's models, reordered together."""

    def __init__(self, parts: list):
        self.parts = parts

    def index_select(self, rows: torch.Tensor) -> "Parts":
        return Parts([part.index_select(rows) for part in self.parts])


class Ensemble(nn.Module):
    """Several models behind the one interface search uses (``encode``, ``decode_step``)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        self.models = nn.ModuleList(models)
        first = models[0]
        self.description = f"ensemble of {len(models)}: {first.description}"
        grids = {model.attention_grid for model in models}
        self.attention_grid = first.attention_grid if len(grids) == 1 else (1, 1)
        self.has_self_attention = False              # one map per model: nothing to combine
        self.max_source_tokens = _shortest(model.max_source_tokens for model in models)
        self.max_output_tokens = _shortest(model.max_output_tokens for model in models)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> Parts:
        return Parts([model.encode(src, src_mask) for model in self.models])

    def decode_step(self, prev_tokens: torch.Tensor, state: Parts | None, memory: Parts,
                    need_attention: bool = True):
        """``(log_probs (B, V), state, attention (B, layers, heads, S))``: the mean of the
        models' log-probabilities; their attention averaged (where all have the same grid;
        else the last layer, heads averaged)."""
        states = state.parts if state is not None else [None] * len(self.models)
        steps = [model.decode_step(prev_tokens, part, parts, need_attention)
                 for model, part, parts in zip(self.models, states, memory.parts)]
        log_probs = torch.stack([log_probs for log_probs, _, _ in steps]).mean(dim=0)
        attention = None
        if need_attention and all(step[2] is not None for step in steps):
            maps = [step[2] for step in steps]
            if len({tuple(a.shape) for a in maps}) > 1:
                maps = [a[:, -1:].mean(dim=2, keepdim=True) for a in maps]
            attention = torch.stack([a.float() for a in maps]).mean(dim=0)
        return log_probs, Parts([new_state for _, new_state, _ in steps]), attention

    def num_parameters(self) -> int:
        return sum(model.num_parameters() for model in self.models)


def _shortest(limits) -> int | None:
    """The smallest of the models' limits (None: they have none)."""
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


class TorchEngine:
    """attnmt's own model (or ensemble) and search in PyTorch."""
    name = "torch"
    parallel_batches = 1                 # its threads share one batch

    def __init__(self, model: nn.Module, autocast_dtype: torch.dtype | None = None):
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.description, self.attention_grid = model.description, model.attention_grid
        self.has_self_attention = model.has_self_attention
        self.max_source_tokens = model.max_source_tokens
        self.max_output_tokens = model.max_output_tokens

    @classmethod
    def from_runs(cls, paths: list[str | Path], checkpoint: str, precision: str,
                  device: str) -> "TorchEngine":
        """The model of one run, or the :class:`Ensemble` of several."""
        target = resolve_device(device, setting="device")
        autocast_dtype = resolve_precision(precision, target, setting="precision")
        models = [RunDirectory(path).load_model(checkpoint)[3].to(target) for path in paths]
        return cls(models[0] if len(models) == 1 else Ensemble(models), autocast_dtype)

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def search(self, sources: list[list[int]], options: SearchOptions,
               prefixes: list[list[int]] | None = None,
               traces: list[list[dict]] | None = None) -> list[list[Hypothesis]]:
        """``options.n_best`` hypotheses for each (non-empty) source of token ids, with their
        attention as NumPy arrays; ``prefixes``: the output tokens each must start with;
        ``traces``: one list per source to fill with the beam search's steps."""
        src, src_mask = (tensor.to(self.device) for tensor in source_tensor(sources))
        lengths = (options.max_len_a, options.max_len_b, options.min_len)
        longest = options.max_output
        with torch.inference_mode(), self._autocast():
            if options.sampling is not None:
                found = sample_search(self.model, src, src_mask, options.sampling, options.n_best,
                                      *lengths, options.need_attention, prefixes, longest=longest)
            elif options.beam == 1 and traces is None:
                found = [[h] for h in greedy_search(self.model, src, src_mask, *lengths,
                                                    options.need_attention, prefixes,
                                                    longest=longest)]
            else:
                found = beam_search(self.model, src, src_mask, options.beam, options.alpha,
                                    *lengths, options.n_best, options.need_attention, prefixes,
                                    traces, longest=longest)
        for source, hypotheses in zip(sources, found):
            for hypothesis in hypotheses:           # the source's own columns, not the padding
                if hypothesis.attention is not None:
                    columns = hypothesis.attention[..., :len(source) + 1]
                    hypothesis.attention = columns.float().cpu().numpy()
        return found

    @torch.inference_mode()
    def self_attention(self, source: list[int], target: list[int]):
        src, src_mask = (tensor.to(self.device) for tensor in source_tensor([source]))
        tgt_in = torch.tensor([[BOS_ID, *target]], device=self.device)
        with self._autocast():
            encoder, decoder = self.model.self_attention(src, src_mask, tgt_in)
        return encoder.float().cpu().numpy(), decoder.float().cpu().numpy()
