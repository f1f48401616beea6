import pytest

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
