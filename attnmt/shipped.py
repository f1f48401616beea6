"""The models shipped with attnmt, found by name: ``attnmt translate de-en``.

Each shipped model is a folder made by ``attnmt export`` (int8 CTranslate2 weights, the
config and the tokenizers) named after its direction, with its model card ``README.md``.
They live in the repository's ``models/`` and are installed with either distribution
(inside the package as ``attnmt/shipped_models``); ``$ATTNMT_MODELS`` names another
folder of them.

Every command that takes a run or an export folder takes a shipped model's name too. An
existing folder wins over a name, as a path should: ``./de-en`` is the folder when it
exists, the shipped model otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnmt.errors import UserError

MODELS_ENV = "ATTNMT_MODELS"
CARD = "README.md"
# A card's example is CTranslate2's translation with oneDNN's AVX2 kernels, which every CPU
# with AVX2 runs: with AVX-512 VNNI the int8 products round differently and a beam can end on
# other words (en-cs: "skrz město" with AVX2 kernels, "městem" with VNNI ones).
CARD_EXAMPLE_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def models_folder() -> Path | None:
    """The folder of shipped models: ``$ATTNMT_MODELS``, the installed package's, or the
    repository's ``models/``; None when there is none."""
    package = Path(__file__).resolve().parent
    candidates = [os.environ.get(MODELS_ENV), package / "shipped_models", package.parent / "models"]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def shipped_models() -> dict[str, Path]:
    """Every shipped model by name, in name order."""
    folder = models_folder()
    if folder is None:
        return {}
    return {path.name: path for path in sorted(folder.iterdir())
            if (path / "model.bin").is_file() and (path / "config.yaml").is_file()}


def resolve(run: str | Path) -> Path:
    """The folder ``run`` names: itself when it exists, else the shipped model of that
    name; neither is one line naming the shipped models."""
    path = Path(run)
    if path.exists():
        return path
    shipped = shipped_models()
    if str(run) in shipped:
        return shipped[str(run)]
    names = ", ".join(shipped) or "none installed"
    raise UserError(f"{run}: no such run or export folder, and no shipped model of that name "
                    f"(shipped models: {names}; 'attnmt models' describes them)")


def shipped_path(run: str) -> str:
    """``run``, or the folder of the shipped model it names where no such folder exists."""
    if not run or Path(run).exists():
        return run
    return str(shipped_models().get(run, run))


@dataclass
class Card:
    """What a model card says in its front matter (the YAML between its first two ``---``)."""
    name: str
    summary: str
    scores: dict                  # test set -> {"bleu", "chrf", "bleu_tok_lc"}
    fields: dict

    @classmethod
    def read(cls, folder: Path) -> "Card":
        """The card of the model in ``folder``; a missing or unreadable one is one line."""
        try:
            _, front, _ = (folder / CARD).read_text(encoding="utf-8").split("---\n", 2)
            fields = yaml.safe_load(front)
            return cls(folder.name, fields["summary"], fields["scores"], fields)
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as error:
            raise UserError(f"{folder / CARD} is not a readable model card "
                            f"({type(error).__name__}: {error})") from None

    def line(self) -> str:
        """The card's summary and its BLEU on each test set, on one line."""
        scores = ", ".join(f"{name} {score['bleu']:.2f}" for name, score in self.scores.items())
        return f"{self.name:6}  {self.summary} BLEU (cased sacreBLEU): {scores}"


def summaries() -> str:
    """One line per shipped model, for ``attnmt models``."""
    shipped = shipped_models()
    if not shipped:
        return ("no shipped models are installed (the repository's models/ folder, or "
                f"${MODELS_ENV})")
    lines = []
    for name, folder in shipped.items():
        try:
            lines.append(Card.read(folder).line())
        except UserError as error:          # the model still translates: say what is wrong
            lines.append(f"{name:6}  ({error})")
    return "\n".join(lines + [f"\nmodel cards: {models_folder()}/NAME/{CARD}"])
