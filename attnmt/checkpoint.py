"""Checkpoints: model weights in safetensors, trainer state with ``torch.load(weights_only=True)``.

Every write goes to a temporary file in the same folder and is renamed into place,
so a kill at any moment leaves the previous file intact. Every read failure (missing,
truncated, corrupt, or another model's file) is a :class:`UserError` naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from attnmt.errors import UserError


def atomic_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def save_weights(model: torch.nn.Module, path: Path, metadata: dict[str, str] | None = None) -> None:
    temporary = atomic_path(path)
    save_model(model, str(temporary), metadata=metadata)
    os.replace(temporary, path)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load weights into ``model``; the file must hold exactly this model's tensors."""
    if not Path(path).is_file():
        raise UserError(f"checkpoint not found: {path}")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except (SafetensorError, RuntimeError, OSError, ValueError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        detail = lines[-1][:200] if lines else type(error).__name__
        raise UserError(f"{path} is not a valid checkpoint for this model ({detail})") from None
    if missing or unexpected:
        names = "; ".join(f"{kind}: {', '.join(sorted(keys)[:3])}{', ...' if len(keys) > 3 else ''}"
                          for kind, keys in (("missing", missing), ("unexpected", unexpected)) if keys)
        raise UserError(f"{path} is not a valid checkpoint for this model ({names})")


@torch.no_grad()
def average_into(model: torch.nn.Module, paths: list[Path]) -> None:
    """Load the element-wise mean of several checkpoints of ``model`` into it."""
    total = None
    for path in paths:
        load_weights(model, path)
        current = {name: tensor.double() for name, tensor in model.state_dict().items()}
        total = current if total is None else {name: total[name] + current[name] for name in total}
    model.load_state_dict({name: (tensor / len(paths)).to(model.state_dict()[name].dtype)
                           for name, tensor in total.items()})


def save_state(state: dict, path: Path) -> None:
    temporary = atomic_path(path)
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_state(path: Path) -> dict:
    """The trainer state, its tensors on the CPU whatever device saved them (the optimizer
    moves its state to its parameters' device when it loads it)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise UserError(f"trainer state not found: {path}") from None
    except Exception as error:  # torch raises many types for a damaged pickle/zip
        raise UserError(f"{path} is not a valid attnmt trainer state ({type(error).__name__})") from None
