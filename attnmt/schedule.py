"""Learning-rate schedules, and the training progress ``p`` that the budget-aware ones follow.

``p`` in [0, 1] is the fraction of the training budget used: training seconds over
``train.max_minutes`` (validation and checkpoints not counted), updates over
``train.max_steps``, or passes over the training data over ``train.max_epochs``; with
several, whichever runs out first. A schedule defined on ``p``
reaches its end exactly when the budget does, on a fast machine or a slow one:

* ``linear``: warmup, then linear decay to zero at ``p = 1`` (Li et al., ICLR 2020,
  "Budgeted training: rethinking deep neural network training under resource constraints");
* ``wsd``: warmup, the peak held ("stable"), then a cooldown over the last ``cooldown``
  fraction of the budget with the 1-sqrt shape (Hägele et al. 2024, "Scaling laws and
  compute-optimal training beyond fixed training durations");
* ``noam``: warmup, then ``lr * sqrt(warmup / step)`` (Vaswani et al. 2017, with the peak
  given directly): it follows steps, not the budget;
* ``constant`` and ``plateau``: warmup, then ``lr`` (times the plateau reductions so far).

Warmup is linear over ``train.warmup`` updates in every schedule.
"""

from __future__ import annotations

import math

from attnmt.config import TrainConfig


def budget_progress(step: int, train_seconds: float, passes: float, config: TrainConfig) -> float:
    """The fraction ``p`` of the budget used after ``step`` updates, ``train_seconds`` of
    training and ``passes`` over the training data (fractional: 2.5 = half of the third);
    all three are required, so that no caller can drop a budget by leaving one out;
    0 when no budget is set (``max_minutes``, ``max_steps`` and ``max_epochs`` all 0)."""
    fractions = []
    if config.max_minutes:
        fractions.append(train_seconds / (config.max_minutes * 60.0))
    if config.max_steps:
        fractions.append(step / config.max_steps)
    if config.max_epochs:
        fractions.append(passes / config.max_epochs)
    return min(1.0, max(fractions, default=0.0))


def learning_rate(step: int, config: TrainConfig, progress: float = 0.0,
                  plateau_scale: float = 1.0) -> float:
    """Learning rate of update ``step`` (1-based) at budget progress ``progress``."""
    warmup = min(1.0, step / config.warmup) if config.warmup else 1.0
    if config.schedule == "noam" and config.warmup and step > config.warmup:
        return config.lr * math.sqrt(config.warmup / step)
    if config.schedule == "linear":
        return config.lr * warmup * (1.0 - progress)
    if config.schedule == "wsd":
        return config.lr * warmup * cooldown_factor(progress, config.cooldown)
    return config.lr * warmup * plateau_scale


def cooldown_factor(progress: float, cooldown: float) -> float:
    """1 until ``1 - cooldown``, then ``1 - sqrt(fraction of the cooldown done)``, 0 at the end."""
    start = 1.0 - cooldown
    if progress <= start:
        return 1.0
    if progress >= 1.0:
        return 0.0
    return 1.0 - math.sqrt((progress - start) / cooldown)
