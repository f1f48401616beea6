"""Training throughput (target tokens/s) and peak RSS of presets on real Multi30k batches.

    python benchmarks/train_throughput.py [--configs configs/multi30k_de_en_transformer.yaml ...]
        [--precisions fp32 bf16] [--steps 60] [--warmup-steps 10] [--data DIR (default: $ATTNMT_DATA)]
        [--set section.key=value ...] [--from-run RUN]

Each (config, precision) runs in its own process: it trains the tokenizer (not timed),
takes `--warmup-steps` updates (not timed), then times `--steps` updates of the real
training loop (forward, backward, clipping, optimizer) on shuffled token batches with
their padding. Tokens/s counts real (non-padding) target tokens. The warm-up seconds
include ``torch.compile``'s compilation with ``--set train.compile=true``.
``--from-run RUN`` starts from a copy of a trained run's weights, optimizer state and
data position instead of fresh weights (late in training, some numbers are slower).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from child import measure_in_child, print_measurement

ROOT = Path(__file__).resolve().parents[1]


def measure(config_path: str, precision: str, steps: int, warmup_steps: int, data: str,
            threads: int, settings: list[str], from_run: str = "") -> dict:
    from attnmt.config import load_config
    from attnmt.process import configure
    from attnmt.run import RunDirectory, prepare_data
    from attnmt.train import Trainer

    overrides = [f"train.precision={precision}", f"data.dir={data}", f"train.threads={threads}",
                 *settings]
    config = load_config(config_path, overrides)
    configure(threads)
    with tempfile.TemporaryDirectory() as folder:
        run = RunDirectory(Path(folder) / "run")
        if from_run:
            shutil.copytree(from_run, run.path)
        else:
            run.path.mkdir()
        trainer = Trainer(config, run, prepare_data(config, run))
        if from_run:
            trainer.resume()
        stream = trainer.batch_stream()
        start = time.perf_counter()
        for _ in range(warmup_steps):
            trainer.train_step([next(stream)])
        warmup_seconds = time.perf_counter() - start
        tokens, padded, start = 0, 0, time.perf_counter()
        for _ in range(steps):
            batch = next(stream)
            padded += batch.tgt_out.numel()
            tokens += trainer.train_step([batch])[1]
        seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "steps_per_s": steps / seconds,
            "tokens_per_step": tokens / steps, "target_padding": 1 - tokens / padded,
            "parameters": trainer.model.num_parameters(), "warmup_s": warmup_seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=[
        str(ROOT / "configs/multi30k_de_en_transformer.yaml"),
        str(ROOT / "configs/multi30k_de_en_bahdanau.yaml")])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="config override for every measured run (repeatable)")
    parser.add_argument("--from-run", default="", help="start from this trained run's state")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print_measurement(measure, args.one[0], args.one[1], args.steps, args.warmup_steps, args.data,
                          args.threads, args.set, args.from_run)
        return
    print(f"{args.threads} threads, {args.steps} timed updates after {args.warmup_steps} warm-up"
          f"{', settings ' + ' '.join(args.set) if args.set else ''}"
          f"{', from ' + args.from_run if args.from_run else ''}\n")
    print("| preset | precision | parameters | target tokens/s | updates/s | tokens/update |"
          " target padding | peak RSS MiB | warm-up s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config in args.configs:
        for precision in args.precisions:
            command = [sys.executable, __file__, "--one", config, precision, "--steps", str(args.steps),
                       "--warmup-steps", str(args.warmup_steps), "--data", args.data,
                       "--threads", str(args.threads), "--from-run", args.from_run]
            command += [argument for setting in args.set for argument in ("--set", setting)]
            result = measure_in_child(command)
            if "error" in result:
                print(f"| {Path(config).stem} | {precision} | not measured: {result['error']} |")
                continue
            print(f"| {Path(config).stem} | {precision} | {result['parameters']:,} | "
                  f"{result['tokens_per_s']:,.0f} | {result['steps_per_s']:.2f} | "
                  f"{result['tokens_per_step']:.0f} | {result['target_padding']:.1%} | "
                  f"{result['peak_rss_mib']:.0f} | {result['warmup_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
