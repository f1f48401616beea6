"""Quality on Multi30k: train a preset for its budget, then score it on every public test set.

    python benchmarks/quality.py CONFIG --run DIR [--data-dir DIR] [--set section.key=value ...]
                                 [--what "a short description"]

Trains with ``attnmt train`` (resuming the run if it exists; an ended run is only
scored), translates each Multi30k test set present for the pair (``test_2016_flickr``,
``test_2017_flickr``, ``test_2017_mscoco``; Czech has the first only; a missing one is
named and skipped) with the config's decoding settings (beam 5, alpha 0.6 in the presets)
and writes ``DIR/quality.json`` in the schema of every file in ``records/results/``
(``benchmarks/results.py``): training figures (minutes, updates, target tokens/s, the
validation curve), sacreBLEU BLEU, chrF and TER, cased and lowercased, per test set, and
what the figures depend on: the machine as what it is (CPU model, cores, its bf16 or AMX
support; the GPU), the precision and threads the run trained with, its seed, the commit
and date of the scoring, and the resolved config; the data folder is written ``DATA``, the
run's parent ``runs`` (a recipe step's: its work folder's parent), the repository ``.``, so
the file can go into ``records/results/`` as it is. The budget is minutes of training time
(validation not counted), so the result depends on the machine's speed: run it with nothing
else on the machine.

With ``--pipeline WORK`` (the run is a step of ``attnmt pipeline RECIPE --work WORK``)
the record adds the recipe's compute and final scores from ``WORK/pipeline.json``:
``extra.recipe_minutes`` per step, ``extra.recipe_hours`` in all, on this machine, and
``extra.recipe_scores``, what its evaluate steps printed (the int8 export's BLEU).
With ``--export FOLDER`` the trained run is exported as int8 into FOLDER and the export is
scored instead, on the CTranslate2 engine (the record of a shipped model in ``models/``),
with its BLEU on ``val`` in ``extra.valid_bleu_beam5``. Every test set's record holds the
literature's BLEU too (``bleu_tok_lc``: lowercased, Moses-tokenised, multi-bleu's figure).
``--made-by COMMAND`` records a command that made the run's input (``attnmt synthesize``
writing its ``data.synthetic`` pairs) in ``extra.made_by``, for the model card.
``--test NAME=PREFIX`` scores another test set too (``iwslt17_test=TED/test``), recorded
under NAME beside Multi30k's.

    python benchmarks/quality.py --ensemble RUN RUN [...] --out FILE.json [--data-dir DIR] [--what ...]

scores trained runs as one ensemble (``attnmt translate RUN RUN``) on the same test sets and
on ``val`` (beam 5: ``extra.valid_bleu_beam5``, beside each run's own) into FILE.json, in the
same schema with no training figures.

    python benchmarks/quality.py --average SOUP --out FILE.json [--export FOLDER]
                                 [--data-dir DIR] [--what ...]

does the same for a folder written by ``attnmt average RUN RUN ... -o SOUP``: the model
scored is the mean of the runs' weights, each run beside it on ``val``; with ``--export
FOLDER`` the soup's int8 export is scored instead, on the CTranslate2 engine (a shipped
model made by averaging).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def train(config: str, run: Path, data_dir: str, overrides: list[str]) -> None:
    """Train ``run``, or resume it (an ended one is only scored)."""
    settings = [*([f"data.dir={data_dir}"] if data_dir else []), *overrides]
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


TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")


def present_test_sets(data_dir: str, src_lang: str, tgt_lang: str) -> list[str]:
    """The Multi30k test sets with files for both languages in ``data_dir``."""
    present = [name for name in TEST_SETS
               if all((Path(data_dir) / f"{name}.{lang}.gz").is_file() for lang in (src_lang, tgt_lang))]
    for name in TEST_SETS:
        if name not in present:
            print(f"quality.py: no {name}.{src_lang}.gz and {name}.{tgt_lang}.gz in {data_dir}; "
                  "that set is skipped", file=sys.stderr)
    return present


def test_scores(run: Path, data_dir: str, others: dict[str, str] | None = None) -> dict:
    """``run``'s scores on each Multi30k test set present and on ``others`` (name: the
    prefix of a set's two language files), with its beam; an export (``attnmt export``) is
    scored on the CTranslate2 engine, as the deployment install translates."""
    from attnmt.config import load_config
    from attnmt.process import configure
    from attnmt.translator import Translator, is_exported

    configure()
    config = load_config(run / "config.yaml")
    translator = Translator.from_run(run)
    scores = set_scores(translator, data_dir, config)
    for name, prefix in (others or {}).items():
        scores[name] = scores_on(translator, Path(prefix), config)
    parameters = (json.loads((run / "export.json").read_text())["parameters"] if is_exported(run)
                  else translator.model.num_parameters())
    return {"parameters": parameters, "beam": config.decode.beam, "test_sets": scores}


def export_scores(run: Path, export: Path, data_dir: str) -> dict:
    """Export ``run`` as int8 into ``export`` (replacing an earlier export there) and return
    the export's BLEU on ``val`` with the run's beam: what a shipped model is chosen by."""
    from attnmt.config import load_config
    from attnmt.translator import Translator

    command = [sys.executable, "-m", "attnmt", "export", str(run), str(export), "--force"]
    if subprocess.run(command).returncode:
        sys.exit(f"exporting {run} failed; see the messages above")
    config = load_config(run / "config.yaml")
    return {"engine": "ctranslate2 int8 (the export in extra.export)", "export": str(export),
            "valid_bleu_beam5": scores_on(Translator.from_run(export), Path(data_dir) / "val",
                                          config)["bleu"]}


def check_test_files(config_path: str, overrides: list[str], others: dict[str, str]) -> None:
    """Raise UserError if a ``--test`` set lacks a file for the config's languages."""
    from attnmt.config import load_config
    from attnmt.data.corpus import find_language_file

    if not others:
        return
    data = load_config(config_path, overrides).data
    for prefix in others.values():
        for lang in (data.src_lang, data.tgt_lang):
            find_language_file(prefix, lang)


def set_scores(translator, data_dir: str, config) -> dict:
    """The translator's scores on each Multi30k test set present in ``data_dir``."""
    return {name: scores_on(translator, Path(data_dir) / name, config)
            for name in present_test_sets(data_dir, config.data.src_lang, config.data.tgt_lang)}


def scores_on(translator, prefix: Path, config) -> dict:
    """BLEU, chrF and TER, cased and lowercased, of the translator's output for one set."""
    from attnmt.data.corpus import read_parallel
    from attnmt.evaluate import score_corpus

    test = read_parallel(prefix, config.data.src_lang, config.data.tgt_lang)
    hypotheses = [t.best.text for t in translator.translate(test.source)]
    cased = score_corpus(hypotheses, test.target, lang=config.data.tgt_lang)
    lowered = score_corpus(hypotheses, test.target, True)
    return {"sentences": len(test.source), "bleu": round(cased.bleu, 2), "chrf": round(cased.chrf, 2),
            "ter": round(cased.ter, 2), "bleu_lc": round(lowered.bleu, 2),
            "chrf_lc": round(lowered.chrf, 2), "bleu_tok_lc": round(cased.bleu_tok_lc, 2),
            "signature": cased.signature}


def ensemble_record(runs: list[Path], data_dir: str, what: str | None,
                    averaged: Path | None = None, export: Path | None = None) -> dict:
    """An ensemble's record (or, with ``averaged``, that of the runs' weight average written
    there, scored as its int8 export into ``export`` if given): its test scores, and
    validation BLEU at beam 5 of it and of each run (training validates greedy), so that it
    is chosen on ``val``. The runs are named by their paths, which ``write_record`` writes
    from ``runs_folder`` on. An average is a run with a config of its own (its decoding
    settings among them), which its provenance keeps; an ensemble has none."""
    from attnmt.config import load_config
    from attnmt.process import configure
    from attnmt.translator import Translator

    configure()
    config = load_config((averaged or runs[0]) / "config.yaml")
    valid = Path(data_dir) / "val"
    members = {str(run.absolute()): scores_on(Translator.from_run(run), valid, config)["bleu"]
               for run in runs}
    if export:
        extra = export_scores(averaged, export, data_dir)
        scored = test_scores(export, data_dir)
    else:
        combined = Translator.from_run(averaged) if averaged else Translator.from_runs(runs)
        extra = {"valid_bleu_beam5": scores_on(combined, valid, config)["bleu"]}
        scored = {"parameters": combined.model.num_parameters() if averaged else None,
                  "beam": config.decode.beam, "test_sets": set_scores(combined, data_dir, config)}
    depends_on = provenance(averaged or runs[0])
    depends_on["seed"] = None
    if not averaged:
        depends_on["config"] = None                     # an ensemble has no config of its own
    data = config.data
    return {"what": what or ("average of " if averaged else "ensemble of ") + ", ".join(members),
            "direction": f"{data.src_lang}-{data.tgt_lang}", "config": None, "overrides": [],
            **scored, "training": None, "provenance": depends_on,
            "extra": {"runs": list(members), **extra, "members_valid_bleu_beam5": members}}


def runs_folder(runs: list[Path]) -> Path:
    """The innermost folder that holds all of ``runs``, which an ensemble's record names
    ``runs``: ``runs/NAME`` for runs side by side, ``runs/A/NAME`` and ``runs/B/NAME`` for two
    runs of one name in two folders."""
    return Path(os.path.commonpath([run.absolute().parent for run in runs]))


def recipe_figures(work: Path) -> dict:
    """A pipeline's compute and final scores, from ``WORK/pipeline.json``."""
    from attnmt.errors import UserError

    path = work / "pipeline.json"
    if not path.is_file():
        raise UserError(f"{path} does not exist; --pipeline takes the --work folder of "
                        "a finished 'attnmt pipeline'")
    try:
        steps = json.loads(path.read_text())
    except ValueError as error:
        raise UserError(f"{path} is not a pipeline's record ({error})") from None
    return {"recipe_minutes": {name: step["minutes"] for name, step in steps.items()},
            "recipe_hours": round(sum(step["minutes"] for step in steps.values()) / 60, 2),
            "recipe_scores": {name: step["test_bleu"] for name, step in steps.items() if step["test_bleu"]}}


def machine() -> str:
    """The machine as what it is: ``2-core AMD EPYC with AVX-512 BF16`` or the GPU's name."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").is_file() else []
    flags = ("AMX" if torch.cpu._is_amx_tile_supported() else
             "AVX-512 BF16" if torch.cpu._is_avx512_bf16_supported() else
             "AVX-512" if torch.cpu._is_avx512_supported() else
             "AVX2" if torch.cpu._is_avx2_supported() else "no AVX2")
    return f"{len(os.sched_getaffinity(0))}-core {names[0] if names else 'CPU'} with {flags}"


def provenance(run: Path) -> dict:
    import torch

    from attnmt.config import load_config
    from attnmt.process import resolve_device, resolve_precision

    config = load_config(run / "config.yaml")
    device = resolve_device(config.train.device)
    dtype = resolve_precision(config.train.precision, device)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    return {"machine": machine(), "precision": precision,
            "threads": config.train.threads or len(os.sched_getaffinity(0)),
            "seed": config.train.seed, "commit": commit or None,
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "config": config.to_dict(),
            "inferred": []}


def without_machine_paths(record: dict, names: dict) -> dict:
    """``record`` with each folder of ``names`` written as its name wherever a string, a
    value or a key, holds it (``/data/multi30k/val`` as ``DATA/val``), as the documents'
    commands name folders, so that the record can be copied into ``records/results/`` as it is."""
    spellings = {str(spelling): name for folder, name in names.items() if str(folder)
                 for spelling in (Path(folder).absolute(), Path(folder).resolve())}
    patterns = [(re.compile(re.escape(folder) + r"(?=[/\],\s]|$)"), spellings[folder])
                for folder in sorted(spellings, key=len, reverse=True)]      # the innermost first

    def portable(value):
        if isinstance(value, dict):
            return {portable(key): portable(item) for key, item in value.items()}
        if isinstance(value, list):
            return [portable(item) for item in value]
        if isinstance(value, str):
            for pattern, name in patterns:
                value = pattern.sub(name, value)
        return value

    return portable(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--run", type=Path)
    parser.add_argument("--ensemble", nargs="+", type=Path, metavar="RUN",
                        help="score these trained runs as one ensemble instead of training")
    parser.add_argument("--average", type=Path, metavar="SOUP",
                        help="score this folder written by 'attnmt average' instead of training")
    parser.add_argument("--out", type=Path, help="the record of --ensemble or --average")
    parser.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value")
    parser.add_argument("--what", help="how the tables name the model (default: the config and --set)")
    parser.add_argument("--test", action="append", default=[], metavar="NAME=PREFIX",
                        help="another test set, scored beside Multi30k's under NAME: the prefix "
                             "of its two language files, as data.train (PREFIX.de.gz, ...)")
    parser.add_argument("--export", type=Path, metavar="FOLDER",
                        help="export the trained run as int8 into FOLDER and score that export "
                             "on the CTranslate2 engine (a shipped model's record)")
    parser.add_argument("--made-by", action="append", default=[], metavar="COMMAND",
                        help="a command that made the run's input (its data.synthetic pairs), "
                             "recorded in extra.made_by for the model card")
    parser.add_argument("--pipeline", type=Path, metavar="WORK",
                        help="the run is a step of this pipeline folder: record the recipe's "
                             "minutes per step and its final scores")
    args = parser.parse_args()
    if args.ensemble or args.average:
        if (args.ensemble and args.average) or not args.out or args.config or args.run or args.set \
                or args.pipeline or args.test or args.made_by or (args.export and args.ensemble) \
                or (args.ensemble and len(args.ensemble) < 2):
            parser.error("--ensemble takes two runs or more and --out (--average: one folder, "
                         "--out and optionally --export), and no CONFIG, --run, --set, --test, "
                         "--made-by or --pipeline")
        if args.ensemble and len({run.resolve() for run in args.ensemble}) < len(args.ensemble):
            parser.error("--ensemble: a run is named twice; an ensemble's runs differ")
        if not args.out.absolute().parent.is_dir():                 # before minutes of scoring
            parser.error(f"--out {args.out}: the folder {args.out.parent} does not exist")
    elif not args.config or not args.run:
        parser.error("CONFIG and --run are required (or --ensemble)")
    elif any("=" not in test for test in args.test):
        parser.error("--test takes NAME=PREFIX, e.g. iwslt17_test=data/iwslt17-de-en/test")
    from attnmt.errors import UserError

    try:      # a bad config or --test file, a damaged run, pipeline record or test set
        if args.ensemble or args.average:
            record_ensemble(args)
        else:
            score_and_record(args, dict(test.split("=", 1) for test in args.test))
    except UserError as error:
        sys.exit(f"quality.py: {error}")


def record_ensemble(args) -> None:
    """Score ``args.ensemble`` as one ensemble (or ``args.average``, the weight average of
    the runs it names) and write its record to ``args.out``."""
    runs = averaged_runs(args.average) if args.average else args.ensemble
    write_record(ensemble_record(runs, args.data_dir, args.what, args.average, args.export), args.out,
                 {args.data_dir: "DATA", runs_folder(runs): "runs"})


def averaged_runs(folder: Path) -> list[Path]:
    """The runs whose weights ``folder`` (written by ``attnmt average``) averages."""
    from attnmt.errors import UserError
    from attnmt.run import RunDirectory

    info = RunDirectory(folder).average
    try:
        return [Path(run) for run in json.loads(info.read_text())["runs"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{folder} was not written by 'attnmt average' (no readable "
                        f"{info.name})") from None


def write_record(record: dict, path: Path, names: dict) -> None:
    """Write ``record`` to ``path`` with the folders of ``names`` (and the repository's) as
    the documents name them, and print it without its provenance."""
    record = without_machine_paths(record, {**names, Path(__file__).resolve().parent.parent: "."})
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({key: value for key, value in record.items() if key != "provenance"}, indent=1))


def score_and_record(args, others: dict[str, str]) -> None:
    """Train ``args.run`` (or resume it), score it and write ``RUN/quality.json``."""
    check_test_files(args.config, args.set, others)                     # before hours of work
    recipe = recipe_figures(args.pipeline) if args.pipeline else None   # before hours of work
    train(args.config, args.run, args.data_dir, args.set)
    depends_on = provenance(args.run)
    data = depends_on["config"]["data"]                     # the resolved config, read once
    extra = {**(recipe or {}), **(export_scores(args.run, args.export, args.data_dir)
                                  if args.export else {}),
             **({"made_by": args.made_by} if args.made_by else {})}
    record = {"what": args.what or " ".join([Path(args.config).stem, *args.set]),
              "direction": "-".join("+".join([data[lang], *data[f"extra_{lang}s"]])
                                    for lang in ("src_lang", "tgt_lang")),
              "config": args.config,
              "overrides": args.set, **test_scores(args.export or args.run, args.data_dir, others),
              "training": training_figures(args.run), "provenance": depends_on}
    if extra:
        record["extra"] = extra
    write_record(record, args.run / "quality.json", record_folders(args))


def record_folders(args) -> dict:
    """How a run's record names its folders: the data ``DATA`` and the folder of the run
    ``runs``, or with ``--pipeline WORK`` the folder of WORK, so that a step's paths keep
    their recipe's folder (``runs/WORK/distilled/pairs``, not ``runs/distilled/pairs``)."""
    return {args.data_dir: "DATA", (args.pipeline or args.run).absolute().parent: "runs"}


if __name__ == "__main__":
    main()
