"""The ``attnmt`` command: argument parsing only; the work lives in the modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnmt import __version__
from attnmt.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Attention-based sequence-to-sequence learning and neural machine translation.")
    parser.add_argument("--version", action="version", version=f"attnmt {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser("demo", help="train on German -> English number words and show "
                                            "the attention (no download, ~3 minutes)")
    demo.add_argument("--run", default="runs/demo", help="run directory (default: runs/demo)")
    demo.set_defaults(handler=run_demo)

    prepare = commands.add_parser("prepare", help="tokenize a corpus once into memory-mapped files",
                                  description="Train the tokenizers and write the training split "
                                              "as token ids in RUN/data, streaming the corpus; "
                                              "'attnmt train' on the same run then reads them.")
    add_config_options(prepare)
    prepare.set_defaults(handler=run_prepare)

    train = commands.add_parser("train", help="train a model, or resume its run directory",
                                description="Train the model a YAML config describes. An existing "
                                            "run directory is resumed exactly.")
    add_config_options(train)
    train.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                       help="train with N processes on this machine (data parallel, started "
                            "through torch.distributed.run, like torchrun)")
    train.set_defaults(handler=run_train)

    translate = commands.add_parser("translate", help="translate raw text with a trained run",
                                    description="Translate raw text, one sentence per line, from "
                                                "-i FILE or standard input.")
    add_decoding_options(translate)
    translate.add_argument("-i", "--input", help="input file (default: standard input)")
    translate.add_argument("-o", "--output", help="output file (default: standard output)")
    translate.add_argument("--n-best", type=int, default=1,
                           help="print N hypotheses (with --sample: N samples) per input as "
                                "'index ||| hypothesis ||| score'")
    translate.add_argument("--alignment", action="store_true",
                           help="append hard alignments (source word-target word pairs)")
    sampling = translate.add_argument_group("sampling (instead of beam search)")
    sampling.add_argument("--sample", action="store_true",
                          help="draw each token from the model's distribution")
    sampling.add_argument("--temperature", type=float, default=1.0,
                          help="divide log-probabilities by T before sampling (default 1)")
    sampling.add_argument("--top-k", type=int, default=0,
                          help="sample among the K most likely tokens (default 0: all)")
    sampling.add_argument("--top-p", type=float, default=1.0,
                          help="sample among the smallest set of tokens whose probability "
                               "reaches P (default 1: all)")
    sampling.add_argument("--seed", type=int, default=0,
                          help="the same seed gives the same samples for the same sentence")
    translate.set_defaults(handler=run_translate)

    evaluate = commands.add_parser("evaluate", help="translate a test set and score it",
                                   description="sacreBLEU BLEU (with signature), chrF and TER.")
    add_decoding_options(evaluate)
    evaluate.add_argument("--src", required=True, help="source file (.gz read too)")
    evaluate.add_argument("--ref", required=True, help="reference file (.gz read too)")
    evaluate.add_argument("--lowercase", action="store_true",
                          help="case-insensitive scores, to compare with older lowercased figures")
    evaluate.add_argument("--by-length", action="store_true",
                          help="also print BLEU per source-length bucket")
    evaluate.add_argument("--hyp", help="also write the translations to this file")
    evaluate.set_defaults(handler=run_evaluate)

    plot = commands.add_parser("plot", help="draw the attention heatmap of one sentence",
                               description="Translate a sentence and draw its attention: one "
                                           "matrix for RNNs, a layer x head grid for Transformers.")
    add_decoding_options(plot)
    plot.add_argument("sentence", help="the source sentence")
    plot.add_argument("-o", "--output", default="attention.png", help="PNG file to write")
    plot.add_argument("--self-attention", action="store_true",
                      help="also draw encoder and decoder self-attention (Transformer)")
    plot.set_defaults(handler=run_plot)

    experiment = commands.add_parser("experiment", help="check a claim of the notes with real numbers",
                                     description="Run one experiment (or 'list' them): trains its "
                                                 "variants and writes results.json, figures and "
                                                 "report.md.")
    experiment.add_argument("name", help="bottleneck, gradients, scaling, scorers, parallelism, "
                                         "heads, or list")
    experiment.add_argument("--budget-minutes", type=float,
                            help="the whole experiment's time budget (default: its own)")
    experiment.add_argument("--out", help="output folder (default: experiments/NAME)")
    experiment.add_argument("--data", choices=["multi30k", "numbers"], default="multi30k",
                            help="Multi30k de->en (default) or the number-words task (quick)")
    experiment.add_argument("--data-dir", default="", help="folder of the Multi30k files")
    experiment.set_defaults(handler=run_experiment)

    export = commands.add_parser("export", help="convert a Transformer run for CTranslate2",
                                 description="Write a CTranslate2 model directory (the C++ "
                                             "inference engine) from a Transformer run, with its "
                                             "config and tokenizers: 'attnmt translate OUT "
                                             "--engine ctranslate2' translates with it. Needs the "
                                             "extra: pip install -e \".[ct2]\".")
    export.add_argument("run", help="run directory made by 'attnmt train'")
    export.add_argument("out", help="folder to write (must be empty or absent, or use --force)")
    export.add_argument("--quantization", choices=["int8", "int8_float32", "bfloat16", "float32"],
                        default="int8", help="weight type (default int8)")
    export.add_argument("--checkpoint", default="best",
                        help="best (default), last, or a .safetensors file of this run's model")
    export.add_argument("--force", action="store_true", help="replace a non-empty folder")
    export.set_defaults(handler=run_export)

    serve = commands.add_parser("serve", help="HTTP API and a web page showing attention",
                                description="Serve POST /translate, GET /health, GET /info and "
                                            "the attention viewer at GET /.")
    serve.add_argument("run", help="run directory made by 'attnmt train'")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-chars", type=int, default=1000, help="characters per text")
    serve.add_argument("--max-texts", type=int, default=32, help="texts per request")
    serve.add_argument("--max-beam", type=int, default=10)
    serve.add_argument("--max-n-best", type=int, default=10)
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20,
                       help="larger request bodies are refused (413) before they are parsed")
    serve.add_argument("--max-work", type=int, default=4000,
                       help="per request: (source tokens + 1) x beam, summed over its texts (413)")
    serve.add_argument("--max-queue-work", type=int, default=16000,
                       help="work accepted and not yet answered; beyond it 503 with Retry-After")
    serve.add_argument("--no-micro-batch", action="store_true",
                       help="decode each request alone instead of batching concurrent ones")
    serve.add_argument("--batch-wait-ms", type=float, default=5.0,
                       help="how long a micro-batch waits for more requests")
    serve.add_argument("--checkpoint", default="best",
                       help="best (default), last, or a .safetensors file of this run's model")
    serve.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32",
                       help="bf16: autocast, only where the hardware runs it natively")
    add_engine_options(serve)
    serve.set_defaults(handler=run_serve)
    return parser


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    parser.add_argument("--run-dir", "--run", dest="run", metavar="DIR",
                        help="run directory (default: runs/<config name>); --run is the same")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value, e.g. --set train.max_steps=1000")


def add_decoding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run directory made by 'attnmt train'")
    parser.add_argument("--beam", type=int, help="beam size (1 = greedy; default: the run's decode.beam)")
    parser.add_argument("--alpha", type=float, help="length penalty exponent (0 = none)")
    parser.add_argument("--batch-tokens", type=int, help="source tokens per batch")
    parser.add_argument("--checkpoint", default="best",
                        help="best (default), last, or a .safetensors file of this run's model")
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32",
                        help="bf16: autocast, only where the hardware runs it natively")
    add_engine_options(parser)


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["torch", "ctranslate2"], default="torch",
                        help="torch (default), or ctranslate2: the C++ engine, with the run "
                             "exported into RUN/ctranslate2-QUANTIZATION on first use")
    parser.add_argument("--quantization", choices=["int8", "int8_float32", "bfloat16", "float32"],
                        default="int8", help="ctranslate2 engine: weight type (default int8)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")


def configure(threads: int = 0) -> None:
    """The process settings every command runs with (attnmt/process.py); torch is imported
    only by the commands that need it, so ``attnmt --help`` stays fast."""
    from attnmt.process import configure as apply

    apply(threads)


def load_translator(args):
    from attnmt.translator import Translator

    if args.beam is not None and args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    configure(args.threads)
    return Translator.from_run(args.run, args.checkpoint, args.precision, args.device, args.engine,
                               args.quantization)


def run_translate(args) -> int:
    from attnmt.translator import hard_alignment

    from attnmt.search import Sampling

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed) if args.sample else None
    if args.n_best < 1:
        raise UserError(f"--n-best must be at least 1, got {args.n_best}")
    translator = load_translator(args)
    beam = max(args.beam or translator.config.decode.beam, args.n_best)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    target = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with source, target:
        for first, lines in read_chunks(source, args.input or "standard input"):
            translations = translator.translate(lines, beam, args.n_best, args.alpha,
                                                args.batch_tokens, need_attention=args.alignment,
                                                sampling=sampling)
            for offset, translation in enumerate(translations):
                for hypothesis in translation.hypotheses[:args.n_best]:
                    fields = [hypothesis.text]
                    if args.n_best > 1:
                        fields = [str(first + offset), hypothesis.text, f"{hypothesis.score:.4f}"]
                    if args.alignment:
                        pairs = hard_alignment(translation, hypothesis, translator.source_tokenizer,
                                               translator.target_tokenizer)
                        fields.append(" ".join(f"{i}-{j}" for i, j in pairs))
                    print(" ||| ".join(fields), file=target, flush=False)
            target.flush()
    return 0


def read_chunks(stream, name: str, size: int = 2000):
    """``(index of first line, lines)`` chunks of a binary stream of UTF-8 lines, so input
    may be endless; a line that is not UTF-8 stops with its number."""
    chunk, first = [], 0
    for number, raw in enumerate(iter(stream.readline, b"")):
        try:
            chunk.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError:
            raise UserError(f"{name}: line {number + 1} is not valid UTF-8") from None
        if len(chunk) == size:
            yield first, chunk
            chunk, first = [], number + 1
    if chunk:
        yield first, chunk


def run_plot(args) -> int:
    from attnmt.plot import plot_sentence

    paths = plot_sentence(load_translator(args), args.sentence, args.output, args.beam,
                          args.self_attention)
    for path in paths:
        print(path)
    return 0


def run_experiment(args) -> int:
    from attnmt.experiments import EXPERIMENTS, Setting, find_experiment, run_experiment as run

    if args.name == "list":
        for experiment in EXPERIMENTS:
            print(f"{experiment.name:<12} {experiment.minutes:>4g} min  {experiment.claim}")
        return 0
    experiment = find_experiment(args.name)
    configure()
    minutes = args.budget_minutes or experiment.minutes
    data = {"dataset": "multi30k", "src_lang": "de", "tgt_lang": "en", "dir": args.data_dir,
            "vocab_size": 8000, "joint_vocab": True, "max_len": 100}
    if args.data == "numbers":
        data = {"dataset": "numbers", "src_lang": "de", "tgt_lang": "en", "vocab_size": 200,
                "joint_vocab": True, "numbers_max": 9999, "numbers_train": 2000,
                "numbers_valid": 100, "numbers_test": 200}
    command = " ".join(["attnmt", "experiment", args.name, "--budget-minutes", f"{minutes:g}",
                        "--data", args.data] + (["--data-dir", args.data_dir] if args.data_dir else []))
    report = run(experiment, Setting(Path(args.out or f"experiments/{args.name}"), minutes, data,
                                     command))
    print(report)
    return 0


def run_serve(args) -> int:
    from attnmt.serve import Limits, serve
    from attnmt.translator import Translator

    limits = Limits(args.max_chars, args.max_texts, args.max_beam, args.max_n_best,
                    args.max_body_bytes, args.max_work, args.max_queue_work)
    configure(args.threads)
    translator = Translator.from_run(args.run, args.checkpoint, args.precision, args.device,
                                     args.engine, args.quantization)
    print(f"serving {args.run} on http://{args.host}:{args.port}/", file=sys.stderr)
    serve(translator, args.host, args.port, limits, not args.no_micro_batch, args.batch_wait_ms)
    return 0


def run_evaluate(args) -> int:
    from attnmt.data.corpus import read_lines
    from attnmt.evaluate import bleu_by_length, score_corpus

    sources, references = read_lines(args.src), read_lines(args.ref)
    if len(sources) != len(references):
        raise UserError(f"line counts differ: {args.src} has {len(sources)} lines, "
                        f"{args.ref} has {len(references)}")
    translator = load_translator(args)
    hypotheses = [t.best.text for t in translator.translate(sources, args.beam, 1, args.alpha,
                                                            args.batch_tokens)]
    if args.hyp:
        Path(args.hyp).write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    print(score_corpus(hypotheses, references, args.lowercase).summary())
    if args.by_length:
        print("\nsource words | sentences | BLEU")
        for bucket, count, bleu in bleu_by_length(hypotheses, references,
                                                  [len(s.split()) for s in sources]):
            print(f"{bucket:>12} | {count:>9} | {bleu:.2f}")
    return 0


def run_export(args) -> int:
    from attnmt.export import export_run

    configure()
    print(export_run(args.run, args.out, args.quantization, args.checkpoint, args.force))
    return 0


def run_demo(args) -> int:
    from attnmt.demo import run_demo as demo

    configure()
    demo(Path(args.run))
    return 0


def run_prepare(args) -> int:
    from attnmt.run import prepare_run

    report = prepare_run(args.config, args.run, args.set)
    print(f"read {report['read']} pairs, kept {report['kept']} (dropped {report['empty']} empty, "
          f"{report['long']} too long) in {report['seconds']} s: {report['pairs_per_s']} pairs/s")
    return 0


def run_train(args) -> int:
    from attnmt.config import load_config
    from attnmt.distributed import finish_worker
    from attnmt.run import default_run_dir
    from attnmt.train import train_config

    config = load_config(args.config, args.set)
    run_dir = args.run or default_run_dir(args.config)
    if args.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if args.nproc_per_node > 1:
        return launch_processes(args.nproc_per_node, args.config, run_dir, args.set)
    configure(config.train.threads)
    print(f"run directory: {train_config(config, run_dir)}")
    return finish_worker(0)


def launch_processes(count: int, config_path: str, run_dir, overrides: list[str]) -> int:
    """``attnmt train`` in ``count`` processes on this machine, through PyTorch's own launcher
    (what ``torchrun --standalone --nproc-per-node count -m attnmt train ...`` runs)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    command = ["--standalone", "--nproc-per-node", str(count), "-m", "attnmt", "train",
               str(config_path), "--run-dir", str(run_dir)]
    for override in overrides:
        command += ["--set", override]
    try:
        torchrun(command)
    except ChildFailedError:
        return 1                                  # the failing process printed its own error
    print(f"run directory: {run_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except UserError as error:
        print(f"attnmt: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    except OSError as error:                 # a file named on the command line: missing, unwritable
        where = f": {error.filename}" if error.filename else ""
        print(f"attnmt: error: {error.strerror or error}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("attnmt: interrupted; the last checkpoint is kept and the same command resumes",
              file=sys.stderr)
        return 130
