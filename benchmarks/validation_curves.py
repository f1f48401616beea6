"""Greedy validation BLEU against training minutes, one line per run.

    python benchmarks/validation_curves.py LABEL=SOURCE [LABEL=SOURCE ...] --out FIGURE.png
        [--title TITLE] [--dashed TEXT]

A SOURCE is a run directory (its ``log.csv``) or the ``quality.json`` that
``benchmarks/quality.py`` wrote for a run (its ``valid_curve``), so the figures in
records/studies.md and records/tuning.md can be redrawn from the JSON files kept beside
them. With ``train.ema_decay`` a run logs the moving average's BLEU too; the curve takes the
better of the two at each validation (what ``best.safetensors`` chooses from).
``--dashed fp32`` draws every run whose label contains "fp32" dashed, so that two machine
cases can be told apart at a glance.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure

from attnmt.run import RunDirectory


def curve(source: Path) -> tuple[list[float], list[float]]:
    """``(training minutes, validation BLEU)`` at each validation of a run."""
    if source.suffix == ".json" and source.is_file():
        return curve_from_quality_json(source)
    if source.is_dir():
        return curve_from_log(source)
    raise SystemExit(f"{source} is neither a run directory nor a quality.json")


def curve_from_quality_json(path: Path) -> tuple[list[float], list[float]]:
    """The curve of a quality.json: rows ``[wall min, training min, step, BLEU, EMA BLEU or null]``."""
    try:
        rows = (json.loads(path.read_text()).get("training") or {}).get("valid_curve")
        if not rows:
            raise SystemExit(f"{path} has no training.valid_curve (its run kept none)")
        return [row[1] for row in rows], [max(b for b in row[3:5] if b is not None) for row in rows]
    except (ValueError, AttributeError, IndexError, TypeError):
        raise SystemExit(f"{path} is not a quality.json written by benchmarks/quality.py") from None


def curve_from_log(run: Path) -> tuple[list[float], list[float]]:
    """The curve of a run directory's log.csv."""
    minutes, bleu = [], []
    try:
        for row in RunDirectory(run).read_log():
            if row.get("valid_bleu"):
                scores = [float(row["valid_bleu"])] + ([float(row["ema_valid_bleu"])]
                                                       if row.get("ema_valid_bleu") else [])
                minutes.append(float(row.get("train_s") or row["elapsed_s"]) / 60)
                bleu.append(max(scores))
    except (KeyError, ValueError):
        raise SystemExit(f"{run}/log.csv is not a log written by attnmt train") from None
    if not minutes:
        raise SystemExit(f"{run} has no validations in a log.csv")
    return minutes, bleu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=SOURCE")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--title", default="greedy validation BLEU during training")
    parser.add_argument("--dashed", metavar="TEXT", help="draw runs whose label contains TEXT dashed")
    args = parser.parse_args()
    if not args.out.parent.is_dir():
        parser.error(f"--out: the folder {args.out.parent} does not exist")
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for item in args.runs:
        label, equals, run = item.partition("=")
        if not equals or not label or not run:
            parser.error(f"{item!r} is not LABEL=SOURCE")
        minutes, bleu = curve(Path(run))
        dashed = args.dashed is not None and args.dashed in label
        axes.plot(minutes, bleu, "--" if dashed else "-", marker="o", markersize=3, label=label)
        print(f"{label}: " + ", ".join(f"{b:.2f} ({m:.0f} min)" for m, b in zip(minutes, bleu)))
    axes.set(title=args.title, xlabel="training minutes", ylabel="validation BLEU (greedy)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
