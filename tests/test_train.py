import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnmt.checkpoint import load_weights, save_weights
from attnmt.config import TrainConfig, load_config
from attnmt.errors import UserError
from attnmt.run import RunDirectory
from attnmt.train import Trainer, learning_rate, train

TINY = """
data:
  dataset: numbers
  tokenizer: sentencepiece
  vocab_size: 80
  joint_vocab: false
  numbers_max: 999
  numbers_train: 600
  numbers_valid: 40
  numbers_test: 40
model:
  arch: transformer
  d_model: 32
  heads: 2
  ffn_dim: 64
  encoder_layers: 1
  decoder_layers: 1
  dropout: 0.1
train:
  lr: 0.003
  warmup: 20
  batch_tokens: 400
  max_steps: 200
  validate_every: 50
  log_every: 1
  threads: 1
  precision: fp32
"""


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def read_log(run: Path) -> list[dict]:
    with open(run / "log.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def losses(run: Path) -> dict[int, str]:
    return {int(row["step"]): row["loss"] for row in read_log(run) if row["loss"]}


def attnmt(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "attnmt", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_learning_rate_schedules():
    noam = TrainConfig(lr=1e-3, warmup=100, schedule="noam")
    assert learning_rate(50, noam) == pytest.approx(5e-4)
    assert learning_rate(100, noam) == pytest.approx(1e-3)
    assert learning_rate(400, noam) == pytest.approx(5e-4)
    constant = TrainConfig(lr=1e-3, warmup=10, schedule="constant")
    assert learning_rate(5, constant) == pytest.approx(5e-4)
    assert learning_rate(10_000, constant) == pytest.approx(1e-3)
    plateau = TrainConfig(lr=1e-3, warmup=0, schedule="plateau")
    assert learning_rate(7, plateau, plateau_scale=0.25) == pytest.approx(2.5e-4)


def test_same_seed_same_first_50_losses(tiny_config, tmp_path):
    runs = []
    for name in ("a", "b"):
        config = load_config(tiny_config, ["train.max_steps=50", "train.validate_every=1000"])
        run = RunDirectory(tmp_path / name)
        run.path.mkdir()
        Trainer(config, run).fit()
        runs.append(losses(run.path))
    assert len(runs[0]) == 50 and runs[0] == runs[1]


def test_short_training_on_numbers_learns(tiny_config, tmp_path):
    run = RunDirectory(train(tiny_config, tmp_path / "run", ["train.max_steps=150"]))
    log = read_log(run.path)
    assert float(log[-1]["valid_loss"]) < 1.0 < float(log[0]["loss"])
    for name in ("config.yaml", "tokenizer.json", "best.safetensors", "last.safetensors",
                 "trainer_state.pt"):
        assert (run.path / name).is_file(), name


def test_resume_after_sigkill_is_exact(tiny_config, tmp_path):
    reference = attnmt("train", str(tiny_config), "--run", str(tmp_path / "reference"))
    assert reference.wait(timeout=300) == 0, reference.stderr.read()

    killed_run = tmp_path / "killed"
    victim = attnmt("train", str(tiny_config), "--run", str(killed_run))
    deadline = time.time() + 240
    while time.time() < deadline:                  # kill between checkpoints 50 and 100
        if (killed_run / "log.csv").is_file() and max(losses(killed_run), default=0) >= 70:
            break
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert max(losses(killed_run)) < 200, "training ended before it could be killed"

    resumed = attnmt("train", str(tiny_config), "--run", str(killed_run))
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert "resuming" in resumed.stderr.read()
    assert losses(killed_run) == losses(tmp_path / "reference")
    assert len(losses(killed_run)) == 200


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "last.safetensors"
    save_weights(model, path)
    before = model.weight.detach().clone()

    def crash(module, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr("attnmt.checkpoint.save_model", crash)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_weights(model, path)
    fresh = torch.nn.Linear(3, 2)
    load_weights(fresh, path)
    torch.testing.assert_close(fresh.weight, before)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_bad_checkpoint_gives_one_clear_error(tmp_path, damage):
    path = tmp_path / "best.safetensors"
    save_weights(torch.nn.Linear(3, 2), path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "garbage":
        path.write_bytes(b"this is not a checkpoint at all")
    else:
        save_weights(torch.nn.Linear(5, 2), path)
    with pytest.raises(UserError, match=f"{path} is not a valid checkpoint for this model"):
        load_weights(torch.nn.Linear(3, 2), path)


def test_cli_reports_config_errors_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  dmodel: 128\n")
    process = attnmt("train", str(path), "--run", str(tmp_path / "run"))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert stderr.strip().splitlines() == [
        "attnmt: error: unknown config key 'model.dmodel'; allowed keys in 'model': "
        + stderr.split("allowed keys in 'model': ")[1].strip()]
    assert "Traceback" not in stderr


def test_resuming_with_a_different_model_is_refused(tiny_config, tmp_path):
    process = attnmt("train", str(tiny_config), "--run", str(tmp_path / "run"),
                     "--set", "train.max_steps=1")
    assert process.wait(timeout=120) == 0
    process = attnmt("train", str(tiny_config), "--run", str(tmp_path / "run"),
                     "--set", "model.d_model=64")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and "different 'model' section" in stderr
