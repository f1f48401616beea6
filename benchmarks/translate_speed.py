"""Decoding speed on Multi30k test_2016_flickr: sentences/s and target tokens/s, load included.

    python benchmarks/translate_speed.py RUN [RUN ...] [--beams 1 5]
        [--settings torch:fp32 torch:bf16 ctranslate2:float32 ctranslate2:int8 ...]

A setting is ENGINE:PRECISION: ``torch`` with ``fp32`` or ``bf16``, ``ctranslate2`` with
``float32``, ``int8``, ``int8_float32`` or ``bfloat16`` (exported into the run before
the clock starts). Each (run, beam, setting) runs in its own process: the clock starts
before the run directory is loaded and stops when the last of the 1000 sentences is
translated. Also prints sacreBLEU of the output, so a faster setting can be checked
for quality.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from child import measure_in_child, print_measurement



def measure(run: str, beam: int, setting: str, data: str, threads: int) -> dict:
    start = time.perf_counter()
    from attnmt.config import load_config
    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import corpus_bleu
    from attnmt.process import configure
    from attnmt.translator import Translator

    engine, precision = setting.split(":")
    configure(threads)
    if engine == "torch":
        translator = Translator.from_run(run, precision=precision)
    else:
        translator = Translator.from_run(run, engine=engine, quantization=precision)
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
    parser.add_argument("--settings", nargs="+", metavar="ENGINE:PRECISION",
                        default=["torch:fp32", "torch:bf16", "ctranslate2:float32",
                                 "ctranslate2:int8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run, beam, setting = args.one
        print_measurement(measure, run, int(beam), setting, args.data, args.threads)
        return
    export_first(args.runs, args.settings)
    print(f"test_2016_flickr (1000 sentences), {args.threads} threads, load time included\n")
    print("| run | beam | engine | precision | seconds | sentences/s | target tokens/s | BLEU |")
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        for beam in args.beams:
            for setting in args.settings:
                command = [sys.executable, __file__, "--one", run, str(beam), setting,
                           "--data", args.data, "--threads", str(args.threads)]
                result = measure_in_child(command)
                engine, precision = setting.split(":")
                if "error" in result:
                    print(f"| {Path(run).name} | {beam} | {engine} | {precision} | not measured: "
                          f"{result['error']} |")
                    continue
                print(f"| {Path(run).name} | {beam} | {engine} | {precision} | {result['seconds']:.1f} | "
                      f"{result['sentences'] / result['seconds']:.0f} | "
                      f"{result['tokens'] / result['seconds']:.0f} | {result['bleu']:.2f} |",
                      flush=True)


def export_first(runs: list[str], settings: list[str]) -> None:
    """Export each run for every CTranslate2 setting before any clock starts."""
    from attnmt.ctranslate2_engine import exported_folder
    from attnmt.errors import UserError
    from attnmt.export import export_run

    for run in runs:
        for engine, precision in (setting.split(":") for setting in settings):
            if engine == "ctranslate2" and not (exported_folder(Path(run), precision) / "model.bin").is_file():
                try:
                    export_run(run, exported_folder(Path(run), precision), precision)
                except UserError as error:
                    print(f"not exported ({precision}): {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
