"""Scale figures: a 3-million-pair corpus through prepare + training, and DDP on CPU.

    python benchmarks/scale.py corpus [--pairs 3000000] [--steps 150] [--jemalloc PATH]
    python benchmarks/scale.py ddp [--steps 60]

Both train with ``--batch-tokens`` target tokens per batch and process (default 4096, the
size of the figures in docs/scaling.md; the preset itself now takes 1024) in ``--precision``
(default bf16).

``corpus``: writes Multi30k de-en training pairs repeated up to ``--pairs`` into a
temporary folder, runs ``attnmt prepare`` (pairs/s), then ``attnmt train`` for
``--steps`` updates of the Transformer preset reading the memory-mapped split, and
reports the peak resident memory of each process (``ru_maxrss`` of the child).
``--jemalloc /usr/lib/x86_64-linux-gnu/libjemalloc.so.2`` runs both commands with
jemalloc preloaded, its page decay off (``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``).
``ddp``: target tokens/s of the Transformer preset on Multi30k with one process and
two threads, and with ``torchrun`` two processes of one thread each.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "configs/multi30k_de_en_transformer.yaml"


MEASURED = ("import resource, sys\nfrom attnmt.cli import main\ncode = main(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(code)")


def allocator_environment(jemalloc: str | None) -> dict:
    if not jemalloc:
        return dict(os.environ)
    if not Path(jemalloc).is_file():
        sys.exit(f"--jemalloc: no such file {jemalloc} (Debian: apt install libjemalloc2)")
    return {**os.environ, "LD_PRELOAD": jemalloc, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}


def run_attnmt(arguments: list[str], environment: dict) -> tuple[float, float]:
    """Run an attnmt command in a child process; returns (seconds, its peak RSS in MiB)."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", MEASURED, *arguments], check=True, env=environment,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - start, int(result.stderr.strip().splitlines()[-1]) / 1024


def write_corpus(folder: Path, data: Path, pairs: int) -> None:
    for lang in ("de", "en"):
        with gzip.open(data / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        with open(folder / f"train.{lang}", "w", encoding="utf-8") as out:
            out.writelines(lines[index % len(lines)] + "\n" for index in range(pairs))
        with gzip.open(data / f"val.{lang}.gz", "rt", encoding="utf-8") as handle:
            (folder / f"val.{lang}").write_text(handle.read(), encoding="utf-8")


def corpus(args) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        write_corpus(folder, Path(args.data), args.pairs)
        settings = ["--set", "data.dataset=files", "--set", f"data.train={folder}/train",
                    "--set", f"data.valid={folder}/val", "--set", f"train.max_steps={args.steps}",
                    "--set", "train.validate_every=100000", "--set", f"train.precision={args.precision}",
                    "--set", f"train.batch_tokens={args.batch_tokens}",
                    "--set", "data.subword_sampling=0"]       # a prepared split cannot be resampled
        run, environment = folder / "run", allocator_environment(args.jemalloc)
        prepare_seconds, prepare_rss = run_attnmt(["prepare", str(PRESET), "--run", str(run),
                                                   *settings], environment)
        train_seconds, train_rss = run_attnmt(["train", str(PRESET), "--run", str(run), *settings],
                                              environment)
        with open(run / "log.csv") as handle:
            rows = [row for row in csv.DictReader(handle) if row["tokens_per_s"]]
    print(f"| pairs | prepare s | prepare pairs/s | prepare peak RSS MiB | train ({args.steps} updates) s"
          " | train peak RSS MiB | target tokens/s |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.pairs:,} | {prepare_seconds:.0f} | {args.pairs / prepare_seconds:,.0f} | "
          f"{prepare_rss:.0f} | {train_seconds:.0f} | {train_rss:.0f} | {rows[-1]['tokens_per_s']} |")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ddp(args) -> None:
    print("| processes x threads | target tokens/s |")
    print("|---|---|")
    for processes, threads in ((1, 2), (2, 1)):
        with tempfile.TemporaryDirectory() as temporary:
            settings = ["--set", f"data.dir={args.data}", "--set", f"train.max_steps={args.steps}",
                        "--set", "train.validate_every=100000", "--set", f"train.threads={threads}",
                        "--set", f"train.log_every={args.steps // 2}", "--set", f"train.precision={args.precision}",
                        "--set", f"train.batch_tokens={args.batch_tokens}"]
            launcher = [sys.executable, "-m", "attnmt"] if processes == 1 else \
                [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
                 "--master-port", str(free_port()), "-m", "attnmt", "--"]
            subprocess.run(launcher + ["train", str(PRESET), "--run", f"{temporary}/run", *settings],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(f"{temporary}/run/log.csv") as handle:
                rows = [row for row in csv.DictReader(handle) if row["tokens_per_s"]]
        print(f"| {processes} x {threads} | {float(rows[-1]['tokens_per_s']):,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["corpus", "ddp"])
    parser.add_argument("--pairs", type=int, default=3_000_000)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--jemalloc", help="path of libjemalloc.so.2 to preload (corpus only)")
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    args = parser.parse_args()
    corpus(args) if args.what == "corpus" else ddp(args)


if __name__ == "__main__":
    main()
