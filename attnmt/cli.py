"""The ``attnmt`` command: argument parsing only; the work lives in the modules."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from attnmt import __version__
from attnmt.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Attention-based sequence-to-sequence learning and neural machine translation.")
    parser.add_argument("--version", action="version", version=f"attnmt {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    models = commands.add_parser("models", help="list the shipped models (translate with "
                                                "'attnmt translate NAME')",
                                 description="The models shipped with attnmt, one line each: "
                                             "what it is and its BLEU; NAME/README.md is its "
                                             "model card. Every command that takes a run takes "
                                             "a shipped model's name.")
    models.set_defaults(handler=run_models)

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
    train.add_argument("--init-from", metavar="RUN",
                       help="fine-tune: start from RUN's weights (train.init_checkpoint: best) and "
                            "tokenizers, with a fresh optimizer, schedule and step count "
                            "(train.init_from); RUN may be an export or a shipped model")
    train.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                       help="train with N processes on this machine (data parallel, started "
                            "through torch.distributed.run, like torchrun)")
    train.set_defaults(handler=run_train)

    translate = commands.add_parser("translate", help="translate raw text with a trained run",
                                    description="Translate raw text, one sentence per line, from "
                                                "-i FILE or standard input, a chunk of lines at a "
                                                "time. Several runs translate as an ensemble.")
    add_decoding_options(translate, ensemble=True)
    translate.add_argument("-i", "--input", help="input file, .gz read too (default: standard input)")
    translate.add_argument("-o", "--output", help="output file (default: standard output)")
    add_stream_options(translate, "-o")
    translate.add_argument("--n-best", type=int, default=1,
                           help="print N hypotheses (with --sample: N samples) per input as "
                                "'index ||| hypothesis ||| score'")
    translate.add_argument("--alignment", action="store_true",
                           help="append hard alignments (source word-target word pairs)")
    translate.add_argument("--prefix", metavar="WORDS",
                           help="every translation starts with these words; the model completes "
                                "them (interactive translation)")
    translate.add_argument("--split-sentences", action="store_true",
                           help="each line is a paragraph: translate it sentence by sentence "
                                "(split by the source language's rules) and keep its spacing")
    add_sampling_options(translate, "draw each token from the model's distribution")
    translate.set_defaults(handler=run_translate)

    synthesize = commands.add_parser(
        "synthesize",
        help="translate text into synthetic pairs (back- and forward translation, distillation)",
        description="Translate a text in language L (-i) with a run (or ensemble) that translates "
                    "L into M, writing the pairs OUT.L (the text) and OUT.M (its translation), "
                    "line for line. Back-translation: a reverse model on target-language text, "
                    "then train with --set 'data.synthetic=[OUT]'. Forward translation: the same "
                    "with a model of the final direction on source-language text. Distillation: "
                    "a teacher on the training sources, then train on OUT as the corpus. "
                    "Resumable, in chunks.")
    add_decoding_options(synthesize, ensemble=True)
    synthesize.add_argument("-i", "--input", required=True, help="text file (.gz read too)")
    synthesize.add_argument("-o", "--output", required=True, metavar="OUT",
                            help="prefix of the pair files to write (OUT.L and OUT.M)")
    add_stream_options(synthesize, "OUT.L and OUT.M")
    add_sampling_options(synthesize, "draw each translation from the model (sampled "
                                     "back-translation) instead of beam search")
    synthesize.set_defaults(handler=run_synthesize)

    clean = commands.add_parser(
        "clean", help="drop the pairs of a parallel corpus that no model should learn",
        description="Filter a parallel corpus (CORPUS.SRC and CORPUS.TGT, .gz too, or a .tsv): "
                    "a side empty, control or non-printing characters, too few or too many "
                    "words, a length ratio beyond --max-ratio, the source equal to the target, "
                    "exact duplicates, and with --langid a side in another language. Writes "
                    "the kept pairs to OUT.SRC and OUT.TGT (OUT.tsv for a .tsv) and the removed "
                    "ones, each with its filter, to OUT.removed.tsv.")
    clean.add_argument("corpus", metavar="CORPUS", help="prefix of the two files, or a .tsv file")
    clean.add_argument("-o", "--output", required=True, metavar="OUT", help="output prefix")
    clean.add_argument("--src-lang", required=True)
    clean.add_argument("--tgt-lang", required=True)
    clean.add_argument("--min-words", type=int, default=1, help="per side (default 1)")
    clean.add_argument("--max-words", type=int, default=250, help="per side (default 250)")
    clean.add_argument("--max-ratio", type=float, default=3.0,
                       help="longest side's words over the shortest's (default 3)")
    clean.add_argument("--langid", action="store_true",
                       help="drop pairs whose sides py3langid identifies as other languages")
    clean.set_defaults(handler=run_clean)

    pipeline = commands.add_parser(
        "pipeline", help="run a recipe: several commands in order, each resumable",
        description="Run the steps of a recipe (train, synthesize, clean, average, export, "
                    "evaluate), each after the steps it names, each into WORK/NAME. Steps "
                    "already done are skipped; an interrupted one resumes. Ends with a table "
                    "of the steps.")
    pipeline.add_argument("recipe", metavar="RECIPE", help="the recipe's YAML file")
    pipeline.add_argument("--work", metavar="DIR",
                          help="folder of the steps' outputs (default: the recipe's 'work', else "
                               "runs/RECIPE-NAME)")
    pipeline.add_argument("--dry-run", action="store_true",
                          help="print the commands in the order they would run, and stop")
    pipeline.set_defaults(handler=run_pipeline)

    evaluate = commands.add_parser("evaluate", help="translate test sets and score them",
                                   description="sacreBLEU BLEU (with signature), chrF and TER, "
                                               "of one test set (--src, --ref) or several "
                                               "(--test PREFIX ...), with one length penalty "
                                               "or several (--alpha A ...).")
    add_decoding_options(evaluate, ensemble=True, several_alphas=True)
    evaluate.add_argument("--src", help="source file (.gz read too)")
    evaluate.add_argument("--ref", help="reference file (.gz read too)")
    evaluate.add_argument("--test", nargs="+", metavar="PREFIX",
                          help="test sets as prefixes of their two language files (the run's "
                               "languages, .gz read too), e.g. DATA/test_2016_flickr "
                               "DATA/test_2017_flickr: each scored, then a table of all")
    evaluate.add_argument("--write-alpha", action="store_true",
                          help="with one run, one set (choose on val) and --alpha A [A ...]: write "
                               "the one of highest BLEU as decode.alpha in the run's config.yaml, "
                               "the default of every later command (chosen with the engine that "
                               "evaluates: an export's CTranslate2 penalty differs)")
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

    export = commands.add_parser("export", help="convert a Transformer run for CTranslate2 or transformers",
                                 description="Write a CTranslate2 model directory (the C++ "
                                             "inference engine) from a Transformer run, with its "
                                             "config (less the folders of the run's machine: "
                                             "data.dir, data.tokenizer_from, train.init_from) and "
                                             "tokenizers: 'attnmt translate OUT' "
                                             "translates with it, without PyTorch (needs the extra: "
                                             "pip install -e \".[ct2]\"). With --format transformers, "
                                             "a MarianMT folder that Hugging Face transformers loads "
                                             "(MarianMTModel, MarianTokenizer).")
    export.add_argument("run", help="run directory made by 'attnmt train'")
    export.add_argument("out", help="folder to write (must be empty or absent, or use --force)")
    export.add_argument("--quantization", choices=["int8", "int8_float32", "bfloat16", "float32"],
                        default="int8", help="weight type (default int8)")
    export.add_argument("--checkpoint", default="best",
                        help="best (default), last, or a .safetensors file of this run's model")
    export.add_argument("--force", action="store_true", help="replace a non-empty folder")
    export.add_argument("--format", choices=["ctranslate2", "transformers"], default="ctranslate2",
                        help="ctranslate2 (default): int8 or other weights for the C++ engine; "
                             "transformers: a MarianMT folder (float32 safetensors)")
    export.set_defaults(handler=run_export)

    importer = commands.add_parser(
        "import", help="a MarianMT model (OPUS-MT) as an attnmt run",
        description="Write a Hugging Face MarianMT folder (config.json, model.safetensors or "
                    "pytorch_model.bin, source.spm, target.spm, vocab.json) as an attnmt run "
                    "directory: it translates, evaluates, serves, exports, and fine-tunes with "
                    "'attnmt train RUN/config.yaml --init-from RUN'. A setting attnmt's "
                    "Transformer cannot compute is refused in one line naming it.")
    importer.add_argument("folder", help="the MarianMT folder (a local copy: nothing is downloaded)")
    importer.add_argument("--run-dir", "--run", dest="run_dir", required=True, metavar="DIR",
                          help="the run directory to write (absent or empty)")
    importer.add_argument("--src-lang", default="", help="source language code (default: the "
                          "folder's tokenizer_config.json)")
    importer.add_argument("--tgt-lang", default="", help="target language code (default: likewise)")
    importer.set_defaults(handler=run_import)

    average = commands.add_parser(
        "average", help="average the weights of runs fine-tuned from one parent",
        description="Write a run whose weights are the mean of the runs' best weights (a "
                    "'model soup'): it translates, exports, evaluates and starts fine-tunings "
                    "like any other run. The runs must share their model, vocabularies and "
                    "languages; runs fine-tuned from one parent average well, others rarely: "
                    "choose on validation.")
    average.add_argument("run", nargs="+", metavar="RUN", help="two or more run directories")
    average.add_argument("-o", "--out", required=True, help="folder to write the averaged run")
    average.add_argument("--force", action="store_true", help="replace an earlier average")
    average.set_defaults(handler=run_average)

    serve = commands.add_parser("serve", help="HTTP API and a web page showing attention",
                                description="Serve POST /translate, GET /health, GET /info and "
                                            "the attention viewer at GET /. Several runs are "
                                            "served side by side; a request's 'model' names one.")
    serve.add_argument("run", nargs="*", metavar="RUN",
                       help="run directory, exported folder or shipped model, as NAME=RUN to "
                            "name it (default name: the folder's); the first is the default "
                            "model (default: every shipped model, see 'attnmt models')")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-chars", type=int, default=1000, help="characters per text")
    serve.add_argument("--max-texts", type=int, default=32, help="texts per request")
    serve.add_argument("--max-beam", type=int, default=10)
    serve.add_argument("--max-n-best", type=int, default=10)
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20,
                       help="larger request bodies are refused (413) before they are parsed")
    serve.add_argument("--max-work", type=int, default=8000,
                       help="per request: output length limit x beam, summed over its texts (413)")
    serve.add_argument("--max-queue-work", type=int, default=32000,
                       help="work accepted and not yet answered; beyond it 503 with Retry-After")
    serve.add_argument("--max-response-values", type=int, default=500_000,
                       help="per request: the numbers and tokens its response may carry "
                            "(attention, self-attention, search steps, n-best), at most (413)")
    serve.add_argument("--max-queue-response-values", type=int, default=2_000_000,
                       help="response values accepted and not yet answered; beyond it 503")
    serve.add_argument("--api-keys", metavar="FILE",
                       help="accept only requests with a key listed in FILE (one per line, each "
                            "optionally followed by its requests per minute): 403 without, 429 "
                            "beyond its rate")
    serve.add_argument("--client-rate", type=int, default=0, metavar="N",
                       help="requests per minute each client address may make to /translate "
                            "and /detect; beyond it 429 with Retry-After (0: no limit)")
    serve.add_argument("--forwarded-allow-ips", default="", metavar="ADDRESSES",
                       help="comma-separated addresses of proxies whose X-Forwarded-For names "
                            "the client (for --client-rate and the logs); default: none, each "
                            "client is the address that connects")
    serve.add_argument("--max-html-tags", type=int, default=10_000,
                       help="'<' per HTML document, counted before it is parsed (413)")
    serve.add_argument("--body-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="a request body still arriving after this long is dropped (408)")
    serve.add_argument("--max-connections", type=int, default=1000,
                       help="requests in progress at once; beyond it 503 with Retry-After")
    serve.add_argument("--max-inflight-body-bytes", type=int, default=64 << 20,
                       help="declared sizes of the request bodies arriving at once; beyond "
                            "it 503 with Retry-After")
    serve.add_argument("--refusal-delay", type=float, default=1.0, metavar="SECONDS",
                       help="an address refused again within SECONDS of its last refusal gets "
                            "its answer after SECONDS (0: at once)")
    serve.add_argument("--no-micro-batch", action="store_true",
                       help="decode each request alone instead of batching concurrent ones")
    serve.add_argument("--batch-wait-ms", type=float, default=5.0,
                       help="how long a micro-batch waits for more requests")
    serve.add_argument("--workers", type=int, default=0, metavar="N",
                       help="micro-batches decoded at once (default: 1 on the PyTorch engine, "
                            "one per CTranslate2 thread)")
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


def add_decoding_options(parser: argparse.ArgumentParser, ensemble: bool = False,
                         several_alphas: bool = False) -> None:
    if ensemble:
        parser.add_argument("run", nargs="+", metavar="RUN",
                            help="run directory made by 'attnmt train', folder made by 'attnmt "
                                 "export', or a shipped model's name (de-en, ...: 'attnmt "
                                 "models'); several runs: their ensemble (same vocabulary)")
    else:
        parser.add_argument("run", help="run directory made by 'attnmt train', folder made by "
                                        "'attnmt export', or a shipped model's name")
    parser.add_argument("--beam", type=int, help="beam size (1 = greedy; default: the run's decode.beam)")
    if several_alphas:
        parser.add_argument("--alpha", type=float, nargs="+",
                            help="length penalty exponent (0 = none; default: the run's "
                                 "decode.alpha); several: each scored, to choose one on val")
    else:
        parser.add_argument("--alpha", type=float, help="length penalty exponent (0 = none)")
    parser.add_argument("--batch-tokens", type=int, help="source tokens per batch")
    parser.add_argument("--checkpoint", default="best",
                        help="best (default), last, or a .safetensors file of this run's model")
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32",
                        help="bf16: autocast, only where the hardware runs it natively")
    parser.add_argument("--target-lang", metavar="LANG",
                        help="output language of a one-to-many model (default: its data.tgt_lang)")
    add_engine_options(parser)


def add_stream_options(parser: argparse.ArgumentParser, output: str) -> None:
    parser.add_argument("--resume", action="store_true",
                        help=f"continue an interrupted run: keep the finished lines of {output} "
                             "and translate the rest of the input (refused when the input or "
                             "the settings differ from the interrupted run's)")
    parser.add_argument("--progress", action="store_true",
                        help="show a progress bar on standard error (shown anyway on a terminal)")


def add_sampling_options(parser: argparse.ArgumentParser, sample_help: str) -> None:
    sampling = parser.add_argument_group("sampling (instead of beam search)")
    sampling.add_argument("--sample", action="store_true", help=sample_help)
    sampling.add_argument("--temperature", type=float, default=1.0,
                          help="divide log-probabilities by T before sampling (default 1)")
    sampling.add_argument("--top-k", type=int, default=0,
                          help="sample among the K most likely tokens (default 0: all)")
    sampling.add_argument("--top-p", type=float, default=1.0,
                          help="sample among the smallest set of tokens whose probability "
                               "reaches P (default 1: all)")
    sampling.add_argument("--seed", type=int, default=0,
                          help="the same seed gives the same samples for the same sentence")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=["auto", "torch", "ctranslate2"], default="auto",
                        help="auto (default): ctranslate2 for a folder made by 'attnmt export', "
                             "else torch; ctranslate2 on a run exports it into "
                             "RUN/ctranslate2-QUANTIZATION on first use, and again "
                             "when its weights have changed")
    parser.add_argument("--quantization", choices=["int8", "int8_float32", "bfloat16", "float32"],
                        help="ctranslate2 engine: weight type (default: int8 for a run, the "
                             "type an export was written in for an export)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: all)")


def configure(threads: int = 0) -> None:
    """The process settings every PyTorch command runs with (attnmt/process.py); torch is
    imported only by the commands that need it, so ``attnmt --help`` stays fast and the
    CTranslate2 engine runs where PyTorch is not installed."""
    from attnmt.process import configure as apply

    apply(threads)


def load_translator(args, runs: list[str] | None = None):
    """The translator of ``runs`` (default: the command's RUN arguments; several make an
    ensemble), with the engine, precision and threads the options ask for."""
    from attnmt.translator import Translator, is_exported

    if args.beam is not None and args.beam < 1:
        raise UserError(f"--beam must be at least 1, got {args.beam}")
    from attnmt.shipped import resolve

    runs = [resolve(run) for run in runs or (args.run if isinstance(args.run, list) else [args.run])]
    engine = args.engine
    if engine == "auto":
        engine = "ctranslate2" if len(runs) == 1 and is_exported(runs[0]) else "torch"
    if engine == "torch":
        configure(args.threads)
    translator = Translator.from_runs(runs, args.checkpoint, args.precision, args.device, engine,
                                      args.quantization, args.threads)
    translator.source_tag(args.target_lang)                  # refuse a language now, not later
    return translator


def sampling_from(args):
    from attnmt.decoding import Sampling

    return Sampling(args.temperature, args.top_k, args.top_p, args.seed) if args.sample else None


def open_input(path: str | None):
    """A binary stream of the input: a file (.gz decompressed) or standard input."""
    if path is None:
        return sys.stdin.buffer
    import gzip

    if not Path(path).is_file():
        raise UserError(f"file not found: {path}")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


# The options that shape what translate and synthesize write: --resume continues only
# an output made with the same ones.
OUTPUT_SETTINGS = ("run", "checkpoint", "engine", "quantization", "precision", "beam", "alpha",
                   "target_lang", "n_best", "alignment", "prefix", "sample", "temperature",
                   "top_k", "top_p", "seed", "split_sentences")


def resume_record(args, outputs: list[Path]):
    """The :class:`attnmt.streaming.ResumeRecord` of a command's output files."""
    from attnmt.streaming import ResumeRecord

    settings = {"command": args.command, **{key: getattr(args, key) for key in OUTPUT_SETTINGS
                                            if hasattr(args, key)}}
    return ResumeRecord(outputs, args.input, settings)


def translate_by_sentence(paragraphs: list[str], lang: str,
                          translate: Callable[[list[str]], list[str]]) -> list[str]:
    """Each paragraph cut into sentences (language ``lang``), all of them translated in one
    call, and each paragraph put back together with its own spacing."""
    from attnmt.documents import join_sentences, split_sentences

    split = [split_sentences(paragraph, lang) for paragraph in paragraphs]
    sentences = [s for found, _ in split for s in found]
    translated = iter(translate(sentences) if sentences else [])
    return [join_sentences([next(translated) for _ in sentences], gaps)
            for sentences, gaps in split]


def run_translate(args) -> int:
    from attnmt import streaming
    from attnmt.translator import hard_alignment

    sampling = sampling_from(args)
    if args.n_best < 1:
        raise UserError(f"--n-best must be at least 1, got {args.n_best}")
    if args.split_sentences and (args.n_best > 1 or args.alignment or args.prefix):
        raise UserError("--split-sentences writes one translated paragraph a line: it cannot be "
                        "combined with --n-best, --alignment or --prefix")
    if args.resume and not (args.input and args.output):
        raise UserError("--resume needs -i FILE and -o FILE: it continues the output file "
                        "from where the input stopped")
    if args.output:
        streaming.refuse_overwriting(args.input, [Path(args.output)])
        if not Path(args.output).parent.is_dir():
            raise UserError(f"folder not found: {Path(args.output).parent}")
    source = open_input(args.input)
    translator = load_translator(args)
    beam = max(args.beam or translator.config.decode.beam, args.n_best)
    record = resume_record(args, [Path(args.output)]) if args.input and args.output else None
    lines = streaming.read_lines(source, args.input or "standard input")
    if record is not None:
        lines = record.start(lines, args.resume)
    done = record.lines if record is not None else 0
    total = streaming.count_lines(args.input) if args.input else None
    bar = streaming.progress_bar(total, args.progress or None, "translate")
    bar.update(done)

    def translate(lines):
        return translator.translate(lines, beam, args.n_best, args.alpha, args.batch_tokens,
                                    need_attention=args.alignment, sampling=sampling,
                                    target_lang=args.target_lang, prefix=args.prefix)

    def translate_paragraphs(lines):
        return translate_by_sentence(lines, translator.config.data.src_lang,
                                     lambda sentences: [t.best.text for t in translate(sentences)])

    def write(first, lines, translations):
        output = []
        if args.split_sentences:
            output = [paragraph + "\n" for paragraph in translations]
            translations = []
        for offset, translation in enumerate(translations):
            for hypothesis in translation.hypotheses[:args.n_best]:
                fields = [hypothesis.text]
                if args.n_best > 1:
                    fields = [str(first + offset), hypothesis.text, f"{hypothesis.score:.4f}"]
                if args.alignment:
                    pairs = hard_alignment(translation, hypothesis, translator.source_tokenizer,
                                           translator.target_tokenizer)
                    fields.append(" ".join(f"{i}-{j}" for i, j in pairs))
                output.append(" ||| ".join(fields) + "\n")
        target.write("".join(output))
        if args.output:
            streaming.sync(target)
        else:
            target.flush()
        if record is not None:
            record.advance(lines)

    with source:
        target = open(args.output, "a" if done else "w", encoding="utf-8") \
            if args.output else sys.stdout
        with target if args.output else contextlib.nullcontext():
            streaming.translate_chunks(translate_paragraphs if args.split_sentences else translate,
                                       lines, write, bar, first=done)
    if record is not None:
        record.finish()
    return 0


def run_synthesize(args) -> int:
    from attnmt import streaming

    source = open_input(args.input)
    translator = load_translator(args)
    data = translator.config.data
    mono_lang, synthetic_lang = data.src_lang, args.target_lang or data.tgt_lang
    paths = {side: Path(f"{args.output}.{lang}")
             for side, lang in (("mono", mono_lang), ("synthetic", synthetic_lang))}
    streaming.refuse_overwriting(args.input, list(paths.values()))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    record = resume_record(args, [paths["mono"], paths["synthetic"]])
    lines = record.start(streaming.read_lines(source, args.input), args.resume)
    done = record.lines
    sampling = sampling_from(args)
    bar = streaming.progress_bar(streaming.count_lines(args.input), args.progress or None,
                                 f"synthesize {mono_lang}->{synthetic_lang}")
    bar.update(done)
    mode = "a" if done else "w"
    with source, open(paths["mono"], mode, encoding="utf-8") as mono, \
            open(paths["synthetic"], mode, encoding="utf-8") as synthetic:
        def translate(lines):
            return translator.translate(lines, args.beam, 1, args.alpha, args.batch_tokens,
                                        sampling=sampling, target_lang=args.target_lang)

        def write(first, lines, translations):
            synthetic.write("".join(t.best.text + "\n" for t in translations))
            mono.write("".join(line + "\n" for line in lines))
            streaming.sync(synthetic)
            streaming.sync(mono)
            record.advance(lines)

        count = streaming.translate_chunks(translate, lines, write, bar, first=done)
    record.finish()
    print(f"{done + count} pairs: {paths['mono']} and its translation {paths['synthetic']}",
          file=sys.stderr)
    return 0


def run_plot(args) -> int:
    import importlib.util

    from attnmt.plot import plot_sentence

    if args.engine == "auto" and importlib.util.find_spec("torch"):
        args.engine = "torch"             # every layer and head, an export's read back from int8
    paths = plot_sentence(load_translator(args), args.sentence, args.output, args.beam,
                          args.self_attention, args.target_lang)
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
    from attnmt.libretranslate import ApiKeys
    from attnmt.serve import Limits, serve
    from attnmt.shipped import shipped_models

    limits = Limits(args.max_chars, args.max_texts, args.max_beam, args.max_n_best,
                    args.max_body_bytes, args.max_work, args.max_queue_work,
                    args.max_response_values, args.max_queue_response_values,
                    args.max_html_tags, args.body_timeout, args.max_connections,
                    args.max_inflight_body_bytes, args.refusal_delay)
    if args.workers < 0:
        raise UserError(f"--workers must be at least 1 (or 0: the engine's default), got {args.workers}")
    if args.client_rate < 0:
        raise UserError(f"--client-rate must be at least 0, got {args.client_rate}")
    api_keys = ApiKeys.from_file(args.api_keys) if args.api_keys else None
    args.beam, args.target_lang = None, None
    runs = args.run or list(shipped_models())
    if not runs:
        raise UserError("name the runs or exports to serve: no shipped model is installed")
    translators = {name: load_translator(args, [run]) for name, run in named_runs(runs)}
    print(f"serving {', '.join(translators)} on http://{args.host}:{args.port}/", file=sys.stderr)
    serve(translators, args.host, args.port, limits, not args.no_micro_batch, args.batch_wait_ms,
          args.workers, api_keys, args.client_rate, args.forwarded_allow_ips)
    return 0


def named_runs(runs: list[str]) -> list[tuple[str, str]]:
    """``NAME=RUN`` or ``RUN`` (named by its folder) -> ``(name, run)``; names are unique."""
    named = []
    for run in runs:
        name, equals, path = run.partition("=")
        if not equals or "/" in name or not name:
            name, path = Path(run).name, run
        named.append((name, path))
    names = [name for name, _ in named]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"two served models are named {repeated[0]!r}; name them with NAME=RUN")
    return named


def run_models(args) -> int:
    from attnmt.shipped import summaries

    print(summaries())
    return 0


def run_pipeline(args) -> int:
    from attnmt.pipeline import Pipeline, summary

    pipeline = Pipeline(args.recipe, args.work)
    rows = pipeline.run(dry_run=args.dry_run, echo=lambda line: print(line, flush=True))
    if not args.dry_run:
        if all(row["status"] == "done before" for row in rows):
            print(f"every step of {args.recipe} is done ({pipeline.record_path}); nothing to run")
        print(summary(rows))
    return 0


def run_clean(args) -> int:
    from attnmt.clean import Bounds, clean_corpus, report

    if not 1 <= args.min_words <= args.max_words or args.max_ratio < 1:
        raise UserError("need 1 <= --min-words <= --max-words and --max-ratio >= 1")
    counts = clean_corpus(args.corpus, args.output, args.src_lang, args.tgt_lang,
                          Bounds(args.min_words, args.max_words, args.max_ratio, args.langid))
    print(report(counts))
    return 0


def run_evaluate(args) -> int:
    from attnmt.data.corpus import find_language_file, read_lines
    from attnmt.evaluate import bleu_by_length, score_corpus
    from attnmt.shipped import resolve

    if bool(args.test) == bool(args.src or args.ref) or bool(args.src) != bool(args.ref):
        raise UserError("give --src FILE and --ref FILE (one test set) or --test PREFIX ... "
                        "(several), not both")
    alphas = args.alpha or [None]
    if args.hyp and (len(args.test or [0]) > 1 or len(alphas) > 1):
        raise UserError("--hyp writes one file: give one test set and one --alpha with it")
    if args.write_alpha and (len(args.run) > 1 or len(args.test or [0]) > 1 or not args.alpha):
        raise UserError("--write-alpha writes one run's decode.alpha, chosen on one set: give "
                        "one run, one test set (val) and the penalties to choose from "
                        "(--alpha A [A ...])")
    translator = load_translator(args)
    for alpha in alphas:                             # every penalty refused before any decoding
        translator.search_options(args.beam, 1, alpha)
    data = translator.config.data
    target = args.target_lang or data.tgt_lang
    files = [(args.src, args.ref)] if args.src else \
        [(find_language_file(prefix, data.src_lang), find_language_file(prefix, target))
         for prefix in args.test]                    # every file found before any decoding
    for source_file, reference_file in files:
        for read in (source_file, reference_file):
            if args.hyp and Path(args.hyp).resolve() == Path(read).resolve():
                raise UserError(f"--hyp {args.hyp} is one of the files evaluate reads ({read}); "
                                "name another file for the hypotheses")
    rows = []
    for source_file, reference_file in files:
        sources, references = read_lines(source_file), read_lines(reference_file)
        if len(sources) != len(references):
            raise UserError(f"line counts differ: {source_file} has {len(sources)} lines, "
                            f"{reference_file} has {len(references)}")
        name = Path(str(source_file)).name.split(".")[0]
        for alpha in alphas:
            hypotheses = [t.best.text for t in translator.translate(
                sources, args.beam, 1, alpha, args.batch_tokens, target_lang=args.target_lang)]
            if args.hyp:
                Path(args.hyp).write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
            scores = score_corpus(hypotheses, references, args.lowercase, target)
            if args.test or len(alphas) > 1:
                print(f"{source_file}" + (f", alpha {alpha}:" if len(alphas) > 1 else ":"))
            print(scores.summary())
            if args.by_length:
                print("\nsource words | sentences | BLEU")
                for bucket, count, bleu in bleu_by_length(hypotheses, references,
                                                          [len(s.split()) for s in sources]):
                    print(f"{bucket:>12} | {count:>9} | {bleu:.2f}")
            rows.append((name, alpha, len(sources), scores))
    if args.test or len(alphas) > 1:
        print_table(rows, with_alpha=len(alphas) > 1)
    if args.write_alpha:
        write_alpha(resolve(args.run[0]), translator.config, highest_bleu(rows, rows[0][0])[1])
    return 0


def write_alpha(run: Path, config, alpha: float) -> None:
    """The run's (or export's) ``config`` written back to it with ``decode.alpha`` = ``alpha``."""
    from dataclasses import replace

    from attnmt.config import save_config
    from attnmt.run import RunDirectory

    path = RunDirectory(run).config
    save_config(replace(config, decode=replace(config.decode, alpha=alpha)), path)
    print(f"decode.alpha {alpha} written to {path}")


def highest_bleu(rows: list, name: str) -> tuple:
    """The row of set ``name`` with the highest BLEU (the first given of those tied)."""
    return max((row for row in rows if row[0] == name), key=lambda row: row[3].bleu)


def print_table(rows: list, with_alpha: bool) -> None:
    """One row per (set, length penalty); with several penalties an alpha column, and each
    set's penalty of highest BLEU (the first given of those tied)."""
    alpha_column = ("alpha | ", "--- | ") if with_alpha else ("", "")
    print(f"\n| test set | {alpha_column[0]}sentences | BLEU | chrF | TER | BLEU lc tok |\n"
          f"| --- | {alpha_column[1]}--- | --- | --- | --- | --- |")
    for name, alpha, count, scores in rows:
        alpha_cell = f"{alpha} | " if with_alpha else ""
        print(f"| {name} | {alpha_cell}{count} | {scores.bleu:.2f} | {scores.chrf:.2f} | "
              f"{scores.ter:.2f} | {scores.bleu_tok_lc:.2f} |")
    if not with_alpha:
        return
    for name in dict.fromkeys(row[0] for row in rows):
        best = highest_bleu(rows, name)
        print(f"highest BLEU on {name}: alpha {best[1]} ({best[3].bleu:.2f})")


def run_export(args) -> int:
    configure()
    if args.format == "transformers":
        from attnmt.marian import export_transformers

        print(export_transformers(args.run, args.out, args.checkpoint, args.force))
        return 0
    from attnmt.export import export_run

    print(export_run(args.run, args.out, args.quantization, args.checkpoint, args.force))
    return 0


def run_import(args) -> int:
    from attnmt.marian import import_marian

    configure()
    print(import_marian(args.folder, args.run_dir, args.src_lang, args.tgt_lang))
    return 0


def run_average(args) -> int:
    from attnmt.averaging import average_runs

    configure()
    print(f"averaged {len(args.run)} runs into {average_runs(args.run, args.out, args.force)}")
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

    if args.init_from:
        args.set = [*args.set, f"train.init_from={args.init_from}"]
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


TORCH_VERSION = "2.13.0"          # the CPU build the README installs


def needs_torch(command: str) -> str:
    """What the command does that needs PyTorch, in the words of its error."""
    return {"train": "training needs PyTorch", "prepare": "preparing training data needs PyTorch",
            "export": "exporting a run needs PyTorch",
            "import": "importing a MarianMT model needs PyTorch",
            "average": "averaging runs needs PyTorch",
            "demo": "the demo trains a model and needs PyTorch",
            "experiment": "experiments train models and need PyTorch"}.get(
        command, f"'attnmt {command}' on a training run needs PyTorch (a folder made by "
                 "'attnmt export' translates without it)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except ModuleNotFoundError as error:
        if error.name not in ("torch", "matplotlib"):
            raise
        needs = (f"{needs_torch(args.command)}: pip install torch=={TORCH_VERSION}"
                 if error.name == "torch" else "drawing needs matplotlib: pip install matplotlib")
        print(f"attnmt: error: {needs}", file=sys.stderr)
        return 1
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
