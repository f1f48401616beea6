"""Greedy validation BLEU against training minutes, one line per run, from their log.csv.

    python benchmarks/validation_curves.py LABEL=RUN [LABEL=RUN ...] --out FIGURE.png
        [--title TITLE]

With ``train.ema_decay`` a run logs the moving average's BLEU too; the curve takes the
better of the two at each validation (what ``best.safetensors`` chooses from).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from matplotlib.figure import Figure

from attnmt.run import RunDirectory


def curve(run: Path) -> tuple[list[float], list[float]]:
    """``(training minutes, validation BLEU)`` at each validation of a run."""
    minutes, bleu = [], []
    for row in RunDirectory(run).read_log():
        if row.get("valid_bleu"):
            scores = [float(row["valid_bleu"])] + ([float(row["ema_valid_bleu"])]
                                                   if row.get("ema_valid_bleu") else [])
            minutes.append(float(row.get("train_s") or row["elapsed_s"]) / 60)
            bleu.append(max(scores))
    return minutes, bleu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--title", default="greedy validation BLEU during training")
    args = parser.parse_args()
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for item in args.runs:
        label, _, run = item.partition("=")
        minutes, bleu = curve(Path(run))
        axes.plot(minutes, bleu, marker="o", markersize=3, label=label)
        print(f"{label}: " + ", ".join(f"{b:.2f} ({m:.0f} min)" for m, b in zip(minutes, bleu)))
    axes.set(title=args.title, xlabel="training minutes", ylabel="validation BLEU (greedy)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
