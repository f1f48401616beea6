"""The run directory: what it holds, its log, its checkpoint names, and the data a run trains on.

A run directory holds everything a run needs to continue or to translate:
``config.yaml``, the tokenizer files, ``checkpoints/step_N.safetensors`` (the last
``train.keep_checkpoints``), ``last.safetensors``, ``best.safetensors``,
``trainer_state.pt`` (optimizer, step, data position, RNG, weight average),
``log.csv``, and with subword sampling ``subwords/epoch_N.npz`` (the segmentation of
the epochs since the last checkpoint). Every other module reaches these files through :class:`RunDirectory`.

Translating with CTranslate2 reads run directories without PyTorch, so what needs it
(building a model, preparing training data) is imported inside the functions that do so.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from attnmt.config import Config, load_config, save_config
from attnmt.data.tokenizers import (TOKENIZER_FILE, Tokenizer, load_tokenizers, save_tokenizers,
                                    train_tokenizers)
from attnmt.errors import UserError

if TYPE_CHECKING:                        # annotations only: these modules need PyTorch
    from attnmt.data.binarized import BinarizedSplit
    from attnmt.data.datasets import TokenizedSplit
    from attnmt.distributed import Cluster

# The columns of log.csv: training rows every ``train.log_every`` updates, validation
# columns at each validation (``ema_*`` with ``train.ema_decay``). ``progress`` is the
# fraction of the budget used (attnmt/schedule.py), ``train_s`` the training seconds it
# counts, ``elapsed_s`` those plus validation and checkpoints.
LOG_COLUMNS = ["step", "epoch", "progress", "loss", "lr", "tokens_per_s", "valid_loss",
               "valid_ppl", "valid_bleu", "ema_valid_loss", "ema_valid_bleu", "train_s",
               "elapsed_s"]


def say(message: str) -> None:
    """A progress message on stderr that does not break the progress bar."""
    tqdm.write(message, file=sys.stderr)


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.log = self.path / "log.csv"
        self.state = self.path / "trainer_state.pt"
        self.last = self.path / "last.safetensors"
        self.best = self.path / "best.safetensors"
        self.checkpoints = self.path / "checkpoints"
        self.average = self.path / "average.json"      # only in an average of runs

    @contextlib.contextmanager
    def held(self):
        """Hold the run while the block runs (a lock the system also frees when the process
        ends, however it ends): a second trainer on the run is refused in one line."""
        import fcntl

        with open(self.path / ".lock", "a+", encoding="utf-8") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise UserError(f"{self.path} is being trained by process {holder}; wait for it "
                                "to end or stop it, then run the command again to resume") from None
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
            yield

    def exists(self) -> bool:
        """Whether training has saved a state to resume from."""
        return self.state.is_file()

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step}.safetensors"

    def segmentation(self, epoch: int) -> Path:
        """The sampled subwords of a training epoch (``data.subword_sampling``)."""
        return self.path / "subwords" / f"epoch_{epoch}.npz"

    def drop_segmentations_before(self, epoch: int) -> None:
        for path in (self.path / "subwords").glob("epoch_*.npz"):
            if int(path.stem.removeprefix("epoch_")) < epoch:
                path.unlink(missing_ok=True)

    def load_model(self, checkpoint: str = "best"):
        """``(config, source tokenizer, target tokenizer, model)`` with the weights of
        ``checkpoint`` (see :meth:`weights`), on the CPU."""
        from attnmt.model import build_model

        self.require_config()
        config = load_config(self.config)
        source_tokenizer, target_tokenizer = load_tokenizers(self.path)
        model = build_model(config.model, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        self.restore(model, checkpoint)
        return config, source_tokenizer, target_tokenizer, model

    def restore(self, model, checkpoint: str = "best") -> None:
        """Load the weights of ``checkpoint`` (see :meth:`weights`) into ``model``; an export
        (``attnmt export``) has one model, its weights read back from CTranslate2's file."""
        from attnmt.checkpoint import load_weights

        if not self.is_export():
            load_weights(model, self.weights(checkpoint))
            return
        if checkpoint not in ("best", "last"):
            raise UserError(f"{self.path} is an export, which holds one model and no checkpoint "
                            f"{checkpoint}")
        from attnmt.export_weights import load_export

        load_export(model, self.path)

    def is_export(self) -> bool:
        """Whether the folder was written by ``attnmt export`` (a CTranslate2 model)."""
        return (self.path / "model.bin").is_file()

    def require_config(self) -> None:
        """Raise UserError unless the directory holds a run's ``config.yaml``."""
        if not self.config.is_file():
            raise UserError(f"{self.path} is not an attnmt run directory (no config.yaml)")

    def weights(self, checkpoint: str = "best") -> Path:
        """``best`` (``last`` until a validation improved), ``last``, or a file path."""
        if checkpoint == "best":
            return self.best if self.best.is_file() else self.last
        if checkpoint == "last":
            return self.last
        return Path(checkpoint)

    def weights_digest(self, checkpoint: str = "best") -> str:
        """SHA-256 of the weights file of ``checkpoint`` ('' where there is none, as in an
        export): what an export made from them records, to tell when they changed."""
        path = self.weights(checkpoint)
        if not path.is_file():
            return ""
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    # --- log.csv ---------------------------------------------------------------------------

    def append_log(self, row: dict) -> None:
        """One row; the header is written with the first."""
        new = not self.log.is_file()
        with open(self.log, "a", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow({key: row.get(key, "") for key in LOG_COLUMNS})

    def read_log(self) -> list[dict[str, str]]:
        """Every row as a dict of strings ('' where a row has no value)."""
        if not self.log.is_file():
            return []
        with open(self.log, newline="") as handle:
            return [{key: value or "" for key, value in row.items()} for row in csv.DictReader(handle)]

    def log_values(self, column: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every row that has ``column``."""
        return [(int(row["step"]), float(row[column])) for row in self.read_log() if row.get(column)]

    def truncate_log(self, step: int) -> None:
        """Drop the rows written after ``step`` (a resumed run writes them again)."""
        rows = [row for row in self.read_log() if int(row["step"]) <= step]
        with open(self.log, "w", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)


def open_run(config: Config, run_dir: str | Path) -> RunDirectory:
    """The run directory, created if needed; an existing one must hold the same experiment,
    and not an average of runs (training there would overwrite its weights)."""
    run = RunDirectory(run_dir)
    if run.average.is_file():
        raise UserError(f"{run.path} holds an average of runs (attnmt average), not a training to "
                        f"resume; train into another --run, starting from it with "
                        f"--set train.init_from={run.path}")
    run.path.mkdir(parents=True, exist_ok=True)
    if run.config.is_file():
        check_same_experiment(load_config(run.config), config, run.config)
    return run


def refuse_destination_holding(out: Path, run: Path, writing: str) -> None:
    """One line, before anything is written, where ``out`` is ``run`` or a folder holding it:
    ``writing`` (e.g. "exporting") there would destroy the run."""
    if out.resolve() == run.resolve() or out.resolve() in run.resolve().parents:
        raise UserError(f"{out} holds the run {run}: {writing} there would destroy it; choose "
                        "another folder")


MADE_BY_ATTNMT = ".attnmt-output"    # in a folder export or average wrote: the files they wrote


def _noted(folder: Path) -> dict | None:
    try:
        noted = json.loads((folder / MADE_BY_ATTNMT).read_text(encoding="utf-8"))
        return noted if isinstance(noted, dict) and isinstance(noted.get("files"), list) else None
    except (OSError, ValueError):
        return None


def mark_made(folder: Path, command: str) -> None:
    """Note in ``folder``, written by ``command``, the files it holds, so that a later command
    may replace exactly those and never what a user put beside them."""
    files = sorted({path.name for path in folder.iterdir()} | {MADE_BY_ATTNMT})
    (folder / MADE_BY_ATTNMT).write_text(json.dumps({"command": command, "files": files},
                                                    indent=1) + "\n", encoding="utf-8")


def made_by(folder: Path) -> str | None:
    """The command that wrote ``folder`` if it holds nothing but what that command noted
    (:func:`mark_made`); None for anything else: a run, a user's files, an older export."""
    noted = _noted(folder)
    if noted is None or not {path.name for path in folder.iterdir()} <= set(noted["files"]):
        return None
    return str(noted.get("command"))


def fresh_temporary(out: Path, command: str) -> Path:
    """An empty folder beside ``out`` to write it in, ``.OUT.tmp``, marked as ``command``'s;
    one that an interrupted ``command`` left is removed, anything else there refused in one
    line."""
    temporary = out.with_name(f".{out.name}.tmp")
    if temporary.exists() or temporary.is_symlink():
        noted = _noted(temporary) if temporary.is_dir() and not temporary.is_symlink() else None
        if noted is None or noted.get("command") != command:
            raise UserError(f"{temporary} exists and was not left by 'attnmt {command}'; remove "
                            "it or choose another output name")
        shutil.rmtree(temporary)
    temporary.mkdir(parents=True)
    (temporary / MADE_BY_ATTNMT).write_text(json.dumps({"command": command, "files": []}) + "\n",
                                            encoding="utf-8")
    return temporary


def replace_folder(finished: Path, out: Path) -> None:
    """Put ``finished`` in the place of ``out`` (absent, empty, or checked by the caller to be
    its own earlier output, :func:`made_by`)."""
    if out.exists():
        shutil.rmtree(out)
    finished.rename(out)


def default_run_dir(config_path: str | Path) -> Path:
    return Path("runs") / Path(config_path).stem


def prepare_run(config_path: str | Path, run_dir: str | Path | None = None, overrides=()) -> dict:
    """``attnmt prepare``: tokenizers and the memory-mapped training split of a run."""
    from attnmt.data.binarized import prepare

    path = Path(run_dir or default_run_dir(config_path))
    config = inherit(load_config(config_path, overrides), path)
    refuse_subword_sampling(config, path)
    run = open_run(config, path)
    save_config(config, run.config)
    return prepare(config, run.path)


def refuse_subword_sampling(config: Config, run_path: Path) -> None:
    """A prepared run stores one segmentation of the training text, so it cannot be resampled."""
    if config.data.subword_sampling:
        raise UserError("data.subword_sampling needs the raw training text, and a prepared run "
                        f"({run_path}/data) holds only token ids; train without "
                        "'attnmt prepare', or prepare and train with --set data.subword_sampling=0")


def check_same_experiment(saved: Config, requested: Config, saved_path: Path) -> None:
    """A run directory continues only the experiment it holds: same data and model. Where
    Multi30k's files lie (``data.dir``, or ``$ATTNMT_DATA`` when it is empty) is not part of
    the experiment: a run resumes after its data has moved, whichever way the folder is named."""
    saved = replace(saved, data=replace(saved.data, dir=requested.data.dir))
    for section in ("data", "model"):
        changed = changed_settings(saved, requested, section)
        if changed:
            raise UserError(f"{saved_path} holds a run with a different '{section}' section: "
                            f"{', '.join(changed)}; resume with the same config or choose a new "
                            "--run directory")


def changed_settings(saved: Config, requested: Config, section: str) -> list[str]:
    """``section.key (old saved, new now)`` for each setting of ``section`` that differs."""
    before, now = asdict(getattr(saved, section)), asdict(getattr(requested, section))
    return [f"{section}.{key} ({before[key]!r} saved, {now[key]!r} now)"
            for key in before if before[key] != now[key]]


REGULARISATION = ("dropout", "attention_dropout", "ffn_dropout")   # may change when fine-tuning
TOKENIZER_SETTINGS = ("tokenizer", "sp_model", "vocab_size", "joint_vocab")


def inherit(config: Config, run_dir: str | Path | None = None) -> Config:
    """A config that starts from another run, checked before any run directory is made:
    ``train.init_from`` (that run's weights and tokenizers: fine-tuning) or
    ``data.tokenizer_from`` (its tokenizers: a shared vocabulary). The run must exist and
    translate the same pair, its vocabulary must hold every tag this config needs and, for
    fine-tuning, its model section must match this one's but for dropout. The config comes
    back with ``data.tokenizer_from`` naming that run and its tokenizer settings, so that
    ``config.yaml`` says what the run uses; a mismatch is one line naming the first. A run
    in ``run_dir`` that began from the same run was checked then: it continues even if
    that run is gone (it holds the tokenizers, and its own weights once it has saved)."""
    init, shared = config.train.init_from, config.data.tokenizer_from
    if not (init or shared):
        return config
    from attnmt.shipped import shipped_path

    init, shared = (shipped_path(name) for name in (init, shared))
    config = replace(config, train=replace(config.train, init_from=init))
    if init and shared and Path(shared).resolve() != Path(init).resolve():
        raise UserError(f"train.init_from ({init}) and data.tokenizer_from ({shared}) name "
                        "different runs: a fine-tuned model keeps the tokenizers of its weights")
    key, source = ("train.init_from", Path(init)) if init else ("data.tokenizer_from", Path(shared))
    saved = RunDirectory(run_dir).config if run_dir is not None else None
    if saved is not None and saved.is_file():
        before = load_config(saved).data
        if before.tokenizer_from and Path(before.tokenizer_from).resolve() == source.resolve():
            return replace(config, data=replace(
                config.data, tokenizer_from=before.tokenizer_from,
                **{name: getattr(before, name) for name in TOKENIZER_SETTINGS}))
    origin = RunDirectory(source)
    if not origin.config.is_file() or not (source / TOKENIZER_FILE).is_file():
        raise UserError(f"{key}: {source} is not an attnmt run directory (no config.yaml and "
                        f"{TOKENIZER_FILE})")
    theirs = load_config(origin.config)
    pair, their_pair = (config.data.src_lang, config.data.tgt_lang), \
        (theirs.data.src_lang, theirs.data.tgt_lang)
    if pair != their_pair:
        raise UserError(f"{key}: {source} translates {'->'.join(their_pair)}, this config "
                        f"{'->'.join(pair)}")
    tags = load_tokenizers(source)[0].tags
    for tag in config.data.tags:
        if tag not in tags:
            raise UserError(f"{key}: the vocabulary of {source} has no tag {tag} (data.synthetic "
                            "or data.extra_tgt_langs need it); train that run with it, or set "
                            "data.synthetic_tag: '' for untagged synthetic pairs")
    if init:
        mine, before = asdict(config.model), asdict(theirs.model)
        for name, value in mine.items():
            if name not in REGULARISATION and before[name] != value:
                raise UserError(f"train.init_from: {source} has model.{name} {before[name]!r}, "
                                f"this config {value!r}; fine-tuning keeps the architecture")
        weights = origin.weights(config.train.init_checkpoint)
        if not origin.is_export() and not weights.is_file():
            raise UserError(f"train.init_from: {weights} not found (train.init_checkpoint: "
                            "best, last or a checkpoint file)")
    data = replace(config.data, tokenizer_from=str(source),
                   **{name: getattr(theirs.data, name) for name in TOKENIZER_SETTINGS})
    return replace(config, data=data)




@dataclass
class TrainingData:
    source_tokenizer: Tokenizer
    target_tokenizer: Tokenizer
    train: TokenizedSplit | BinarizedSplit
    valid: TokenizedSplit
    real: TokenizedSplit | None = None    # the training pairs without the synthetic ones, read
                                          # when data.synthetic_until ends them before the budget


def prepare_data(config: Config, run: RunDirectory, cluster: Cluster | None = None) -> TrainingData:
    """Tokenizers (trained once by rank 0, then loaded from the run directory) and splits.

    After ``attnmt prepare`` the training split is read from its memory-mapped files;
    otherwise it is read and tokenized in memory.
    """
    from attnmt.data.binarized import BinarizedSplit, is_prepared
    from attnmt.data.datasets import load_split, tokenize_split
    from attnmt.distributed import Cluster, barrier

    cluster = cluster or Cluster()
    if is_prepared(run.path):
        refuse_subword_sampling(config, run.path)
        source_tokenizer, target_tokenizer = load_tokenizers(run.path)
        train_split = BinarizedSplit(run.path)
        report = train_split.report
    else:
        train_corpus = load_split(config.data, "train")
        if cluster.is_main and not (run.path / TOKENIZER_FILE).is_file():
            save_tokenizers(run.path, *train_tokenizers(config.data, train_corpus.source,
                                                        train_corpus.target))
        barrier(cluster)
        source_tokenizer, target_tokenizer = load_tokenizers(run.path)
        train_split, report = tokenize_split(train_corpus, source_tokenizer, target_tokenizer,
                                             config.data.max_len)
    if cluster.is_main:
        say(report)
    real_split = None
    if config.data.synthetic_until < 1:
        real_corpus = load_split(replace(config.data, synthetic=(), synthetic_until=1.0), "train")
        real_split, _ = tokenize_split(real_corpus, source_tokenizer, target_tokenizer,
                                       config.data.max_len)
    valid_split, _ = tokenize_split(load_split(config.data, "valid"), source_tokenizer,
                                    target_tokenizer)
    return TrainingData(source_tokenizer, target_tokenizer, train_split, valid_split, real_split)
