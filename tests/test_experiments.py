import json
import subprocess
import sys

import pytest

from attnmt.experiments import EXPERIMENTS, Setting, run_experiment

NUMBERS = {"dataset": "numbers", "src_lang": "de", "tgt_lang": "en", "vocab_size": 80,
           "joint_vocab": True, "numbers_max": 999, "numbers_train": 120, "numbers_valid": 12,
           "numbers_test": 24}
SHAPES = {"bottleneck": (4, 6), "gradients": (2, 5), "scaling": (8, 6), "scorers": (6, 6),
          "parallelism": (6, 7), "heads": (5, 4)}


@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=lambda e: e.name)
def test_experiment_smoke(experiment, tmp_path, monkeypatch):
    import attnmt.experiments as experiments

    monkeypatch.setattr(experiments, "SMALL_TRAIN", {**experiments.SMALL_TRAIN, "max_steps": 2,
                                                     "batch_tokens": 300, "threads": 1,
                                                     "precision": "fp32"})
    for name in ("RNN", "TRANSFORMER"):
        small = {**getattr(experiments, name), "embed_dim": 16, "hidden_dim": 16,
                 "attention_dim": 16, "d_model": 16, "ffn_dim": 32, "heads": 2}
        monkeypatch.setattr(experiments, name, small)
    setting = Setting(tmp_path, 0.05, NUMBERS, f"attnmt experiment {experiment.name}")
    report = run_experiment(experiment, setting)
    results = json.loads((tmp_path / "results.json").read_text())
    rows, columns = SHAPES[experiment.name]
    assert len(results["rows"]) == rows and len(results["columns"]) == columns
    assert all(len(row) == columns for row in results["rows"])
    text = report.read_text()
    assert text.startswith(f"# Experiment `{experiment.name}`") and "Reproduce:" in text
    for line in text.splitlines():
        if line.startswith("!["):
            assert (tmp_path / line.split("(")[1].rstrip(")")).stat().st_size > 1000


def test_experiment_list_and_unknown_name():
    listing = subprocess.run([sys.executable, "-m", "attnmt", "experiment", "list"],
                             capture_output=True, text=True, timeout=60)
    assert [line.split()[0] for line in listing.stdout.splitlines()] == [e.name for e in EXPERIMENTS]
    unknown = subprocess.run([sys.executable, "-m", "attnmt", "experiment", "magic"],
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 1 and "unknown experiment 'magic'" in unknown.stderr
