"""Decoding speed on Multi30k test_2016_flickr: sentences/s and target tokens/s, load included.

    python benchmarks/translate_speed.py RUN [RUN ...] [--beams 1 5] [--precisions fp32 bf16]

Each (run, beam, precision) runs in its own process: the clock starts before the run
directory is loaded and stops when the last of the 1000 sentences is translated. Also
prints sacreBLEU of the output, so a faster setting can be checked for quality.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from child import measure_in_child, print_measurement



def measure(run: str, beam: int, precision: str, data: str, threads: int) -> dict:
    start = time.perf_counter()
    from attnmt.config import load_config
    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import corpus_bleu
    from attnmt.process import configure
    from attnmt.translator import Translator

    configure(threads)
    translator = Translator.from_run(run, precision=precision)
    config = load_config(Path(run) / "config.yaml")
    test = read_parallel(Path(data) / "test_2016_flickr", config.data.src_lang, config.data.tgt_lang)
    loaded = time.perf_counter()
    translations = translator.translate(test.source, beam=beam)
    seconds = time.perf_counter() - start
    tokens = sum(len(t.best.ids) + 1 for t in translations)
    hypotheses = [t.best.text for t in translations]
    return {"seconds": seconds, "load_seconds": loaded - start, "sentences": len(hypotheses),
            "tokens": tokens, "bleu": corpus_bleu(hypotheses, test.target)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run, beam, precision = args.one
        print_measurement(measure, run, int(beam), precision, args.data, args.threads)
        return
    print(f"test_2016_flickr (1000 sentences), {args.threads} threads, load time included\n")
    print("| run | beam | precision | seconds | sentences/s | target tokens/s | BLEU |")
    print("|---|---|---|---|---|---|---|")
    for run in args.runs:
        for beam in args.beams:
            for precision in args.precisions:
                command = [sys.executable, __file__, "--one", run, str(beam), precision,
                           "--data", args.data, "--threads", str(args.threads)]
                result = measure_in_child(command)
                if "error" in result:
                    print(f"| {Path(run).name} | {beam} | {precision} | not measured: {result['error']} |")
                    continue
                print(f"| {Path(run).name} | {beam} | {precision} | {result['seconds']:.1f} | "
                      f"{result['sentences'] / result['seconds']:.0f} | "
                      f"{result['tokens'] / result['seconds']:.0f} | {result['bleu']:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
