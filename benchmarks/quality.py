"""Quality on Multi30k: train a preset for its budget, then score it on test_2016_flickr.

    python benchmarks/quality.py CONFIG --run DIR [--data-dir DIR] [--set section.key=value ...]

Trains with ``attnmt train`` (resuming the run if it exists; an ended run is only
scored), translates ``test_2016_flickr`` with the config's decoding settings (beam 5,
alpha 0.6 in the presets) and prints one row of the README's results table:
parameters, training minutes, updates, target tokens/s, sacreBLEU BLEU and chrF cased
and lowercased. The row is also written to ``DIR/quality.json``. The budget is minutes
of training time (validation not counted), so the result depends on the machine's
speed: run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import os
import json
import subprocess
import sys
from pathlib import Path


def train(config: str, run: Path, data_dir: str, overrides: list[str]) -> None:
    settings = [f"data.dir={data_dir}", *overrides]
    command = [sys.executable, "-m", "attnmt", "train", config, "--run-dir", str(run)]
    for setting in settings:
        command += ["--set", setting]
    if subprocess.run(command).returncode:
        sys.exit(f"training {run} failed; see the messages above")


def training_figures(run: Path) -> dict:
    """Training and wall minutes, updates, mean logged target tokens/s and validation BLEU
    (greedy; the weights and, with train.ema_decay, their moving average) from log.csv."""
    from attnmt.run import RunDirectory

    log = RunDirectory(run)
    rows = log.read_log()
    speeds = [value for _, value in log.log_values("tokens_per_s")]
    bleu = {column: [value for _, value in log.log_values(column)]
            for column in ("valid_bleu", "ema_valid_bleu")}
    figures = {"minutes": round(float(rows[-1]["train_s"]) / 60, 1),
               "wall_minutes": round(float(rows[-1]["elapsed_s"]) / 60, 1),
               "updates": int(rows[-1]["step"]), "tokens_per_s": round(sum(speeds) / len(speeds)),
               "valid_bleu_last": round(bleu["valid_bleu"][-1], 2),
               "valid_bleu_best": round(max(bleu["valid_bleu"] + bleu["ema_valid_bleu"]), 2),
               "valid_curve": [(round(float(row["elapsed_s"]) / 60, 2), round(float(row["train_s"]) / 60, 2),
                                int(row["step"]), float(row["valid_bleu"]),
                                float(row["ema_valid_bleu"]) if row["ema_valid_bleu"] else None)
                               for row in rows if row["valid_bleu"]]}
    return figures


def test_scores(run: Path, data_dir: str) -> dict:
    from attnmt.config import load_config
    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import score_corpus
    from attnmt.process import configure
    from attnmt.translator import Translator

    configure()
    config = load_config(run / "config.yaml")
    test = read_parallel(Path(data_dir) / "test_2016_flickr", config.data.src_lang,
                         config.data.tgt_lang)
    translator = Translator.from_run(run)
    hypotheses = [t.best.text for t in translator.translate(test.source)]
    cased, lowered = score_corpus(hypotheses, test.target), score_corpus(hypotheses, test.target, True)
    return {"parameters": translator.model.num_parameters(), "beam": config.decode.beam,
            "bleu": round(cased.bleu, 2), "chrf": round(cased.chrf, 2),
            "bleu_lc": round(lowered.bleu, 2), "chrf_lc": round(lowered.chrf, 2),
            "signature": cased.signature}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value")
    args = parser.parse_args()
    train(args.config, args.run, args.data_dir, args.set)
    row = {"config": args.config, "overrides": args.set, **training_figures(args.run),
           **test_scores(args.run, args.data_dir)}
    (args.run / "quality.json").write_text(json.dumps(row, indent=1) + "\n")
    print(json.dumps(row, indent=1))
    print(f"| {Path(args.config).stem} {' '.join(args.set)} | {row['parameters']:,} | {row['minutes']} "
          f"| {row['updates']:,} | {row['tokens_per_s']:,} | {row['valid_bleu_best']} | {row['bleu']} "
          f"| {row['chrf']} | {row['bleu_lc']} | {row['chrf_lc']} |")


if __name__ == "__main__":
    main()
