"""An exponential moving average of a model's weights, kept beside them during training.

After update ``t`` (1-based) every parameter's shadow moves toward the new weights::

    d_t = min(decay, (1 + t) / (10 + t))
    shadow = d_t * shadow + (1 - d_t) * weight

The ramp ``(1 + t) / (10 + t)`` (as in TensorFlow's ``ExponentialMovingAverage`` with
``num_updates``) keeps the first updates from being dominated by the initial weights.
Shadows are float32 whatever the training precision, and start as a copy of the weights.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class ExponentialMovingAverage:
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.names = [name for name, _ in model.named_parameters()]    # tied weights once
        self.shadow = [parameter.detach().float().clone() for parameter in model.parameters()]

    def factor(self, step: int) -> float:
        return min(self.decay, (1.0 + step) / (10.0 + step))

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        weights = [parameter.detach().float() for parameter in model.parameters()]
        torch._foreach_lerp_(self.shadow, weights, 1.0 - self.factor(step))

    @contextlib.contextmanager
    def applied(self, model: nn.Module):
        """The model holds the averaged weights inside the block, its own ones again after."""
        parameters = list(model.parameters())
        saved = [parameter.detach().clone() for parameter in parameters]
        with torch.no_grad():
            for parameter, shadow in zip(parameters, self.shadow):
                parameter.copy_(shadow)
        try:
            yield model
        finally:
            with torch.no_grad():
                for parameter, original in zip(parameters, saved):
                    parameter.copy_(original)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.shadow))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if sorted(state) != sorted(self.names):
            raise ValueError("the saved weight average belongs to another model")
        self.shadow = [state[name].float().clone() for name in self.names]
