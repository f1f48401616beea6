"""``attnmt pipeline RECIPE.yaml``: a recipe of several commands run as one.

A recipe names its steps, each one attnmt command with its options::

    work: runs/numbers          # where every step's output goes (--work overrides; default
                                # runs/RECIPE-NAME, from where the command runs)
    steps:
      reverse: {train: configs/numbers_de_en.yaml, set: [data.src_lang=en, data.tgt_lang=de]}
      back: {synthesize: [reverse], input: mono.en}
      teacher: {train: configs/numbers_de_en.yaml, set: ["data.synthetic=[@back]"]}
      fast: {export: teacher}
      penalty: {evaluate: [fast], test: [data/val], alpha: [0.6, 1, 1.5], write_alpha: true}
      score: {evaluate: [fast], test: [data/test]}

``@name`` in a value (and the run names of ``synthesize``, ``average``, ``export`` and
``evaluate``) stands for that step's output: a train step's run directory, a synthesize
step's pairs (``WORK/NAME/pairs``, a prefix), a clean step's corpus
(``WORK/NAME/clean``), an average's or an export's folder. The references order the
steps: a step runs after those it names, otherwise in the order written (``penalty``
writes the export's length penalty before ``score`` reads it). A relative path that
exists beside the recipe (a config, a text, a setting's value) is read from there; inside
a list (``data.synthetic=[...]``) give references or paths as written.
``$VARIABLES`` are expanded (``$ATTNMT_DATA/test_2016_flickr``).

Each step runs as its own ``attnmt`` process, its output in ``WORK/NAME.log``. A step that
ends well is recorded in ``WORK/pipeline.json`` with its command; running the recipe again
skips it, and refuses to when the recipe now gives that step another command. An
interrupted step is started again with the same command, and resumes as the command
itself does: a training run exactly, a synthesis with ``--resume``; clean, average, export
and evaluate start over. A failing step stops the pipeline with its log's last line; the
earlier steps' outputs stay. A step's minutes in the record are those of every try that
made its output, failed and interrupted (Ctrl-C) ones included, each written at its end
in the log; a try killed outright (SIGKILL) writes none and is not counted.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnmt.errors import UserError

ACTIONS = ("train", "synthesize", "clean", "average", "export", "evaluate")
OPTIONS = {   # what each action accepts besides its own key, and the command-line flag of each
    "train": {"set": "--set"},
    "synthesize": {"input": "-i", "target_lang": "--target-lang", "beam": "--beam",
                   "sample": "--sample", "temperature": "--temperature", "top_k": "--top-k",
                   "top_p": "--top-p", "seed": "--seed", "engine": "--engine"},
    "clean": {"src_lang": "--src-lang", "tgt_lang": "--tgt-lang", "max_ratio": "--max-ratio",
              "min_words": "--min-words", "max_words": "--max-words", "langid": "--langid"},
    "average": {},
    "export": {"quantization": "--quantization"},
    "evaluate": {"test": "--test", "beam": "--beam", "engine": "--engine", "alpha": "--alpha",
                 "write_alpha": "--write-alpha"},
}
TRY_MINUTES = "[pipeline] minutes of this try: "   # the log's line after each try
REFERENCE = re.compile(r"@([A-Za-z0-9_-]+)")
WRITTEN_ALPHA = re.compile(r"^decode\.alpha (\S+) written to ", re.M)   # evaluate --write-alpha


@dataclass
class Step:
    name: str
    action: str
    target: object                   # the action's value: a config, runs, a corpus
    options: dict

    def references(self) -> list[str]:
        """The steps this one needs."""
        named = []
        if self.action in ("synthesize", "average", "export", "evaluate"):
            named += [run for run in _as_list(self.target) if not _looks_like_path(run)]
        for value in [self.target, *self.options.values()]:
            for text in _as_list(value):
                named += REFERENCE.findall(str(text))
        return list(dict.fromkeys(named))


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _looks_like_path(text) -> bool:
    return "/" in str(text) or str(text).startswith(".")


def read_recipe(path: str | Path) -> tuple[list[Step], Path]:
    """The recipe's steps in an order that runs each after those it names, and its work
    folder; one line naming the first problem otherwise."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"recipe not found: {path}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), dict) or not raw["steps"]:
        raise UserError(f"{path}: a recipe is a mapping with 'steps' (name: command) and "
                        "optionally 'work'")
    unknown = set(raw) - {"steps", "work"}
    if unknown:
        raise UserError(f"{path}: unknown key {sorted(unknown)[0]!r} (a recipe has steps, work)")
    steps = {}
    for name, body in raw["steps"].items():
        if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
            raise UserError(f"{path}: step name {name!r}: letters, digits, - and _ only")
        actions = [key for key in (body or {}) if key in ACTIONS] if isinstance(body, dict) else []
        if len(actions) != 1:
            raise UserError(f"step {name}: give exactly one of {', '.join(ACTIONS)}")
        action = actions[0]
        options = {key: value for key, value in body.items() if key != action}
        for key in options:
            if key not in OPTIONS[action]:
                raise UserError(f"step {name}: {action} takes "
                                f"{', '.join(OPTIONS[action]) or 'no options'}, not {key!r}")
        steps[name] = Step(str(name), action, body[action], options)
    return _ordered(steps), Path(str(raw.get("work", f"runs/{path.stem}")))


def _ordered(steps: dict[str, Step]) -> list[Step]:
    order, visiting = [], set()

    def visit(step: Step) -> None:
        if step in order:
            return
        if step.name in visiting:
            raise UserError(f"step {step.name} depends on itself through its references")
        visiting.add(step.name)
        for name in step.references():
            if name not in steps:
                raise UserError(f"step {step.name} names {name!r}, which is not a step")
            visit(steps[name])
        visiting.discard(step.name)
        order.append(step)

    for step in steps.values():
        visit(step)
    return order


def output(step: Step, work: Path) -> Path:
    """Where a step writes: a run directory, a prefix of pairs, a folder."""
    return {"train": work / step.name, "synthesize": work / step.name / "pairs",
            "clean": work / step.name / "clean", "average": work / step.name,
            "export": work / step.name,
            "evaluate": work / step.name / "scores.txt"}[step.action]


def names_a_file_beside(base: Path, text: str) -> bool:
    """Whether ``text`` names a file or folder in ``base`` (or the stem of files there, a
    corpus ``data/train`` of ``train.de`` and ``train.en``). Text that cannot be a name (an
    absolute path, a list, a glob pattern, one too long for the file system) names none."""
    if not text or text.startswith(("/", "[")) or glob.has_magic(text):
        return False
    beside = base / text
    try:
        return beside.exists() or any(beside.parent.glob(glob.escape(beside.name) + ".*"))
    except (OSError, ValueError):
        return False


def command(step: Step, steps: dict[str, Step], work: Path, base: Path) -> list[str]:
    """The ``attnmt`` command of a step, references replaced by paths."""
    def resolve(text) -> str:
        """References replaced by paths; a path that exists beside the recipe made absolute
        (a setting's value too: ``data.train=corpus``)."""
        text = REFERENCE.sub(lambda match: str(output(steps[match.group(1)], work)),
                             os.path.expandvars(str(text)))
        if "=" in text:
            key, value = text.split("=", 1)
            return f"{key}={resolve(value)}"
        return str(base / text) if names_a_file_beside(base, text) else text

    def run(name) -> str:
        return str(output(steps[name], work)) if name in steps else resolve(name)

    out = output(step, work)
    if step.action == "train":
        arguments = ["train", resolve(step.target), "--run", str(out)]
    elif step.action == "synthesize":
        arguments = ["synthesize", *map(run, _as_list(step.target)), "-o", str(out)]
        if any(out.parent.glob(f"{out.name}.*.resume.json")):      # interrupted: continue
            arguments.append("--resume")
    elif step.action == "clean":
        arguments = ["clean", resolve(step.target), "-o", str(out)]
    elif step.action == "average":
        arguments = ["average", *map(run, _as_list(step.target)), "-o", str(out), "--force"]
    elif step.action == "export":
        arguments = ["export", run(step.target), str(out), "--force"]
    else:
        arguments = ["evaluate", *map(run, _as_list(step.target))]
    for key, value in step.options.items():
        flag = OPTIONS[step.action][key]
        if key == "set":
            for setting in _as_list(value):
                arguments += ["--set", resolve(setting)]
        elif value is True:
            arguments.append(flag)
        elif value is not False:
            values = [resolve(item) for item in _as_list(value)]
            arguments += [flag, *values]
    return arguments


STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _end_with_parent() -> None:
    """In the step's process, before it starts: end it (SIGTERM) when the pipeline ends,
    however the pipeline ends (Linux's parent-death signal)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def run_step_process(arguments: list[str], log) -> int:
    """``attnmt ARGUMENTS`` in a process group of its own, its output to ``log``, and its
    exit status. A signal that would stop the pipeline (Ctrl-C, SIGTERM, SIGHUP) is passed
    on to the step, and once it has ended the pipeline stops, naming the signal; if the
    pipeline is killed outright, the step gets SIGTERM."""
    step = subprocess.Popen([sys.executable, "-m", "attnmt", *arguments], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"},
                            start_new_session=True,
                            preexec_fn=_end_with_parent if sys.platform == "linux" else None)
    received = []

    def forward(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(step.pid, signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {number: signal.signal(number, forward) for number in STOPPING_SIGNALS} \
        if in_main_thread else {}
    try:
        returncode = step.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if received:
        raise UserError(f"stopped by {signal.Signals(received[0]).name}, and so was the step "
                        f"{shlex.join(arguments[:2])}; run the same command again to continue")
    return returncode


class Pipeline:
    """A recipe's steps, the record of those done, and how to run the rest."""

    def __init__(self, recipe: str | Path, work: str | Path | None = None):
        self.steps, default_work = read_recipe(recipe)
        self.base = Path(recipe).resolve().parent
        self.work = (Path(work) if work else default_work).resolve()
        self.by_name = {step.name: step for step in self.steps}
        self.record_path = self.work / "pipeline.json"

    def done(self) -> dict:
        if not self.record_path.is_file():
            return {}
        try:
            return json.loads(self.record_path.read_text())
        except json.JSONDecodeError:
            raise UserError(f"{self.record_path} is damaged; remove it to run every step "
                            "again (finished runs resume at once)") from None

    def command(self, step: Step) -> list[str]:
        return command(step, self.by_name, self.work, self.base)

    def run(self, dry_run: bool = False, echo=print) -> list[dict]:
        """Run the steps not yet done, in order; the summary rows of every step."""
        done, rows = self.done(), []
        for step in self.steps:
            arguments = self.command(step)
            if dry_run:
                echo("attnmt " + shlex.join(arguments))
                continue
            if step.name in done:
                self._check_unchanged(step, arguments, done[step.name])
                rows.append({**done[step.name], "step": step.name, "status": "done before"})
                continue
            rows.append(self._run_step(step, arguments, done, echo))
        return rows

    def _check_unchanged(self, step: Step, arguments: list[str], record: dict) -> None:
        """A done step is skipped only if the recipe still asks for the command that made
        its output (records written before commands were kept are taken as they are)."""
        recorded = record.get("command")
        if recorded is not None and recorded != shlex.join(arguments):
            raise UserError(f"step {step.name} in {self.work} was made by another command "
                            f"(attnmt {recorded}); the recipe now asks for attnmt "
                            f"{shlex.join(arguments)}. Give the changed step a new name, or "
                            f"another --work, so the old output is not taken for the new")

    def _run_step(self, step: Step, arguments: list[str], done: dict, echo) -> dict:
        self.work.mkdir(parents=True, exist_ok=True)
        output(step, self.work).parent.mkdir(parents=True, exist_ok=True)
        log = self.work / f"{step.name}.log"
        echo(f"[{step.name}] attnmt {shlex.join(arguments)}")
        start = time.perf_counter()
        try:
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(f"$ attnmt {shlex.join(arguments)}\n")
                handle.flush()
                returncode = run_step_process(arguments, handle)
        finally:  # a failed or interrupted try counts too: the step's output cost it
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(f"{TRY_MINUTES}{(time.perf_counter() - start) / 60:.2f}\n")
        if returncode:
            last = [line for line in _output_lines(log) if line.strip()]
            raise UserError(f"step {step.name} failed: {last[-1] if last else 'no output'} "
                            f"(its log: {log}); the steps before it are kept")
        minutes = round(sum(float(line[len(TRY_MINUTES):]) for line in
                            log.read_text(encoding="utf-8").splitlines()
                            if line.startswith(TRY_MINUTES)), 2)
        row = {"step": step.name, "status": "ran", "minutes": minutes,
               "valid_bleu": validation_bleu(step, self.work),
               "test_bleu": self._test_bleu(step, log)}
        done[step.name] = {**{key: row[key] for key in ("minutes", "valid_bleu", "test_bleu")},
                           "command": shlex.join(arguments)}
        temporary = self.record_path.with_suffix(".json.partial")
        temporary.write_text(json.dumps(done, indent=1))
        os.replace(temporary, self.record_path)
        return row

    def _test_bleu(self, step: Step, log: Path) -> str | None:
        """An evaluate step's scores, written to its ``scores.txt`` from its last run's
        output; ``set BLEU, ...`` for the summary."""
        if step.action != "evaluate":
            return None
        printed = "\n".join(_output_lines(log)).rsplit("$ attnmt ", 1)[-1].split("\n", 1)[-1]
        output(step, self.work).write_text(printed, encoding="utf-8")
        table = [[cell.strip() for cell in line.split("|")] for line in printed.splitlines()
                 if line.startswith("| ") and not line.startswith("| ---")]
        if not table:
            return None
        columns = table[0]                  # test set | [alpha |] sentences | BLEU | chrF | TER
        cells = [dict(zip(columns, row)) for row in table[1:]]
        written = WRITTEN_ALPHA.search(printed)
        return ", ".join(row["test set"] + (f" alpha {row['alpha']}" if "alpha" in row else "")
                         + f" {row['BLEU']}" for row in cells) \
            + (f" (wrote alpha {written.group(1)})" if written else "")


def _output_lines(log: Path) -> list[str]:
    """A step's log as its commands printed it, without the pipeline's minutes lines."""
    return [line for line in log.read_text(encoding="utf-8").splitlines()
            if not line.startswith(TRY_MINUTES)]


def validation_bleu(step: Step, work: Path) -> float | None:
    """The best validation BLEU in a train step's log.csv."""
    if step.action != "train":
        return None
    from attnmt.run import RunDirectory

    values = [value for _, value in RunDirectory(work / step.name).log_values("valid_bleu")]
    return round(max(values), 2) if values else None


def summary(rows: list[dict]) -> str:
    lines = ["| step | status | minutes | validation BLEU | test BLEU |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        bleu = "" if row.get("valid_bleu") is None else f"{row['valid_bleu']:.2f}"
        lines.append(f"| {row['step']} | {row['status']} | {row.get('minutes', '')} | {bleu} "
                     f"| {row.get('test_bleu') or ''} |")
    return "\n".join(lines)
