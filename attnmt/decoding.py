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
        if not 0.0 < self.temperature < float("inf"):
            raise UserError(f"temperature must be positive, got {self.temperature}")
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
