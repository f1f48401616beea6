import numpy as np
import pytest

from attnmt.errors import UserError
from attnmt.plot import PanelTitles, cross_attention_figure, plot_sentence
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


def panel_titles(figure):
    return [axes.get_title() for axes in figure.axes]


def test_panels_are_titled_by_layer_and_head_in_the_language_asked(tiny_runs):
    transformer = Translator.from_run(tiny_runs["transformer"])
    translation = transformer.translate(["dreihundertzwölf"], need_attention=True)[0]
    one_layer = translation.best.attention                  # (rows, 1 layer, heads, columns)
    translation.best.attention = np.concatenate([one_layer, one_layer], axis=1)   # two layers
    heads = one_layer.shape[2]
    titles = panel_titles(cross_attention_figure(translation))
    assert len(titles) == 2 * (heads + 1)
    assert titles[0] == "cross-attention layer 1, head 1"
    assert titles[heads] == "cross-attention layer 1, average"
    assert titles[-2] == f"cross-attention layer 2, head {heads}"
    korean = PanelTitles(head="{name} {layer}층, head {head}", average="{name} {layer}층, 평균")
    titles = panel_titles(cross_attention_figure(translation, "교차 어텐션", korean))
    assert titles[1] == "교차 어텐션 1층, head 2" and titles[-1] == "교차 어텐션 2층, 평균"
    rnn = Translator.from_run(tiny_runs["rnn"]).translate(["sieben"], need_attention=True)[0]
    assert panel_titles(cross_attention_figure(rnn, "어텐션 분포")) == ["어텐션 분포"]
