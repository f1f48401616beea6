"""Averages of a model's weights: a moving one kept during training, and that of several runs.

**During training** (``train.ema_decay``): after update ``t`` (1-based) every parameter's
shadow moves toward the new weights::

    d_t = min(decay, (1 + t) / (10 + t))
    shadow = d_t * shadow + (1 - d_t) * weight

The ramp ``(1 + t) / (10 + t)`` (as in TensorFlow's ``ExponentialMovingAverage`` with
``num_updates``) keeps the first updates from being dominated by the initial weights.
Shadows are float32 whatever the training precision, and start as a copy of the weights.

**Of several runs** (``attnmt average RUN RUN ... -o OUT``): the element-wise mean of
their best weights, written as a run that translates, exports, evaluates and starts
fine-tunings (``train.init_from``) like any other; it is not a training to resume. The
mean of two models is a good model only when they lie in one basin of the loss: runs
fine-tuned from one parent on different data, a "model soup" (Wortsman et al., 2022,
arXiv:2203.05482). Two runs trained from scratch, or a run and its own continuation on a
fresh schedule, usually average into a worse model; choose on validation.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from attnmt.errors import UserError
from attnmt.run import (RunDirectory, fresh_temporary, made_by, mark_made,
                        refuse_destination_holding, replace_folder)


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


def average_runs(runs: list[str | Path], out: str | Path, force: bool = False) -> Path:
    """Write ``out``: ``config.yaml`` and the tokenizers of ``runs[0]``, ``best.safetensors``
    the mean of the runs' best weights, and ``average.json`` (the runs' and the weight files'
    absolute paths). The runs must share their model (but for dropout), vocabularies
    and languages. Written in a temporary folder and renamed into place: an interrupted
    average leaves nothing half-written."""
    from attnmt.checkpoint import average_into, save_weights
    from attnmt.config import save_config
    from attnmt.data.tokenizers import save_tokenizers
    from attnmt.translator import check_compatible

    runs, out = [Path(run) for run in runs], Path(out)
    if len(runs) < 2:
        raise UserError(f"averaging needs at least two runs, got {len(runs)}")
    directories = [RunDirectory(run) for run in runs]
    weights = [directory.weights() for directory in directories]
    for run, directory, path in zip(runs, directories, weights):
        directory.require_config()
        if not path.is_file():
            raise UserError(f"{run} holds no PyTorch weights (best or last .safetensors): average "
                            "training runs, not exports")
    check_destination(runs, out, force)
    config, source_tokenizer, target_tokenizer, model = directories[0].load_model()
    for run in runs[1:]:
        check_compatible(runs[0], config, source_tokenizer, target_tokenizer, run, "average")
        check_same_model(runs[0], config, run)
    average_into(model, weights)
    temporary = fresh_temporary(out, "average")
    save_config(config, temporary / "config.yaml")
    save_tokenizers(temporary, source_tokenizer, target_tokenizer)
    save_weights(model, temporary / "best.safetensors", {"weights": f"mean of {len(runs)} runs"})
    info = {"runs": [str(run.absolute()) for run in runs],
            "weights": [str(path.absolute()) for path in weights]}
    RunDirectory(temporary).average.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    mark_made(temporary, "average")
    replace_folder(temporary, out)
    return out


def check_same_model(first: Path, config, other: Path) -> None:
    """The runs' ``model`` sections agree but for dropout (a fine-tuning may change it)."""
    from attnmt.config import load_config
    from attnmt.run import REGULARISATION

    mine, theirs = asdict(config.model), asdict(load_config(RunDirectory(other).config).model)
    changed = [f"model.{key} {mine[key]!r} and {theirs[key]!r}" for key in mine
               if key not in REGULARISATION and mine[key] != theirs[key]]
    if changed:
        raise UserError(f"cannot average {first} with {other}: their models differ "
                        f"({', '.join(changed)})")


def check_destination(runs: list[Path], out: Path, force: bool) -> None:
    """``out`` is absent, empty, or (with ``force``) an earlier average; never a run being
    averaged or a folder holding one, never a training run or an export."""
    for run in runs:
        refuse_destination_holding(out, run, "writing the average")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if made_by(out) != "average":
        raise UserError(f"{out} exists and was not written by 'attnmt average' (a training run, "
                        "an export or other files), which an average never replaces; choose "
                        "another folder")
    if not force:
        raise UserError(f"{out} holds an earlier average; choose another folder or add --force")
