import subprocess
import sys

import pytest

import attnmt.demo
from attnmt.errors import UserError
from attnmt.plot import plot_sentence
from attnmt.translator import Translator


def is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rnn_heatmap(tiny_runs, tmp_path):
    (path,) = plot_sentence(Translator.from_run(tiny_runs["rnn"]), "sieben", tmp_path / "a.png")
    assert is_png(path)


def test_transformer_grid_and_self_attention(tiny_runs, tmp_path):
    paths = plot_sentence(Translator.from_run(tiny_runs["transformer"]), "dreihundertzwölf",
                          tmp_path / "t.png", self_attention=True)
    assert [p.name for p in paths] == ["t.png", "t.encoder.png", "t.decoder.png"]
    assert all(is_png(p) for p in paths)


def test_no_attention_model_and_empty_sentence_are_refused(tiny_runs, tmp_path):
    translator = Translator.from_run(tiny_runs["none"])
    with pytest.raises(UserError, match="this model has no attention to draw"):
        plot_sentence(translator, "sieben", tmp_path / "n.png")
    with pytest.raises(UserError, match="the sentence is empty"):
        plot_sentence(translator, "  ", tmp_path / "n.png")


def test_plot_command_prints_the_png_path(tiny_runs, tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnmt", "plot", str(tiny_runs["rnn"]), "sieben",
                             "-o", str(tmp_path / "c.png"), "--threads", "1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == str(tmp_path / "c.png")


def test_demo_smoke(tmp_path, monkeypatch, capsys):
    small = {**attnmt.demo.DEMO_CONFIG,
             "data": {**attnmt.demo.DEMO_CONFIG["data"], "numbers_train": 300, "numbers_test": 40,
                      "numbers_valid": 20},
             "train": {**attnmt.demo.DEMO_CONFIG["train"], "max_steps": 20, "validate_every": 20,
                       "threads": 1}}
    monkeypatch.setattr(attnmt.demo, "DEMO_CONFIG", small)
    accuracy = attnmt.demo.run_demo(tmp_path / "demo")
    output = capsys.readouterr().out
    assert 0.0 <= accuracy <= 1.0
    assert "exact match on 40 held-out numbers" in output and "vierundzwanzig  ->" in output
    assert is_png(tmp_path / "demo" / "attention_vierundzwanzig.png")
