"""What a search is asked and what it returns, shared by both engines without PyTorch.

:class:`Hypothesis` is one output of a search (:mod:`attnmt.search` on the PyTorch
engine, :mod:`attnmt.ctranslate2_engine` on the C++ one); :class:`Sampling` and
:class:`SearchOptions` say how to search. Attention travels as NumPy arrays, so a
translator that runs on CTranslate2 alone never needs PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnmt.errors import UserError

# The smallest sampling temperature. Search divides float32 log-probabilities, shifted so
# that the best is 0, by the temperature as a float32: below float32's smallest normal
# number (1.2e-38) the temperature turns into a denormal or 0, and 0 / 0 is NaN; from here
# on the best token stays at 0 and the others at most overflow to -inf (probability 0).
MIN_TEMPERATURE = 1e-37


@dataclass
class Hypothesis:
    tokens: list[int]                       # output ids, without BOS and EOS
    score: float                            # search score (log-probability, length-normalised in beam)
    log_prob: float                         # sum of token log-probabilities, EOS included
    attention: np.ndarray | None = None     # (T, layers, heads, S), EOS included


@dataclass(frozen=True)
class Sampling:
    """How sampling draws each token: the model's distribution with its log-probabilities
    divided by ``temperature``, cut to the ``top_k`` most likely tokens (0: all) and to the
    smallest set whose mass reaches ``top_p`` (1: all), renormalised."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not MIN_TEMPERATURE <= self.temperature < float("inf"):
            raise UserError(f"temperature must be at least {MIN_TEMPERATURE:g} (below it every "
                            f"score overflows), got {self.temperature:g}")
        if self.top_k < 0:
            raise UserError(f"top-k must be >= 0 (0: all tokens), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.seed < 0:
            raise UserError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class SearchOptions:
    beam: int
    alpha: float
    n_best: int
    max_len_a: float
    max_len_b: int
    min_len: int
    need_attention: bool
    sampling: Sampling | None = None
    max_output: int | None = None           # the model's longest output (EOS included); None: any

    def __post_init__(self):
        if self.alpha < 0:
            raise UserError(f"alpha (the length penalty) must be >= 0, got {self.alpha}")

    def output_limit(self, source_tokens: int) -> int:
        """See :func:`output_limit`."""
        return output_limit(source_tokens, self.max_len_a, self.max_len_b, self.max_output)


def output_limit(source_tokens: int, a: float, b: int, longest: int | None = None) -> int:
    """The most output tokens (EOS included) the search may write for a source of
    ``source_tokens`` pieces (tags counted, EOS not): ``a * source_tokens + b``, at least 1,
    and at most ``longest``, the positions of the model's decoder (None: no bound)."""
    limit = max(1, int(source_tokens * a + b))
    return limit if longest is None else min(limit, longest)
