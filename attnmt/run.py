"""The run directory: what it holds, opening it, and the data a run trains on.

A run directory holds everything a run needs to continue or to translate:
``config.yaml``, the tokenizer files, ``checkpoints/step_N.safetensors`` (the last
``train.keep_checkpoints``), ``last.safetensors``, ``best.safetensors``,
``trainer_state.pt`` (optimizer, step, data position, RNG) and ``log.csv``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from attnmt.config import Config, load_config, save_config
from attnmt.data.binarized import BinarizedSplit, is_prepared, prepare
from attnmt.data.datasets import load_split, tokenize_split
from attnmt.data.tokenizers import (TOKENIZER_FILE, load_tokenizers, save_tokenizers,
                                    train_tokenizers)
from attnmt.distributed import Cluster, barrier
from attnmt.errors import UserError


def say(message: str) -> None:
    """A progress message on stderr that does not break the progress bar."""
    tqdm.write(message, file=sys.stderr)


class RunDirectory:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.config = self.path / "config.yaml"
        self.log = self.path / "log.csv"
        self.state = self.path / "trainer_state.pt"
        self.last = self.path / "last.safetensors"
        self.best = self.path / "best.safetensors"
        self.checkpoints = self.path / "checkpoints"

    def exists(self) -> bool:
        return self.state.is_file()


def open_run(config: Config, run_dir: Path) -> RunDirectory:
    """The run directory, created if needed; an existing one must hold the same experiment."""
    run = RunDirectory(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    if run.config.is_file():
        check_same_experiment(load_config(run.config), config, run.config)
    return run


def prepare_run(config_path: str | Path, run_dir: str | Path | None = None, overrides=()) -> dict:
    """``attnmt prepare``: tokenizers and the memory-mapped training split of a run."""
    config = load_config(config_path, overrides)
    run = open_run(config, Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem)
    save_config(config, run.config)
    return prepare(config, run.path)


def check_same_experiment(saved: Config, requested: Config, saved_path: Path) -> None:
    """A run directory continues only the experiment it holds: same data and model."""
    for section in ("data", "model"):
        if getattr(saved, section) != getattr(requested, section):
            raise UserError(f"{saved_path} holds a run with a different '{section}' section; "
                            "resume with the same config or choose a new --run directory")


def prepare_data(config: Config, run: RunDirectory, cluster: Cluster):
    """Tokenizers (trained once by rank 0, then loaded from the run directory) and splits.

    After ``attnmt prepare`` the training split is read from its memory-mapped files;
    otherwise it is read and tokenized in memory.
    """
    if is_prepared(run.path):
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
    valid_split, _ = tokenize_split(load_split(config.data, "valid"), source_tokenizer,
                                    target_tokenizer)
    return (source_tokenizer, target_tokenizer), train_split, valid_split
