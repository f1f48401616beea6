"""Attention heatmaps: source tokens on the x axis, output tokens on the y axis.

Attention is a grid over layers and heads: one matrix for an RNN (one layer, one
head), a layer x head grid with the head average as the last column for the
Transformer, for cross-attention and, on request, for the encoder and decoder
self-attention. Figures are drawn with matplotlib's object-oriented ``Figure``, so no
backend (and no display) is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from attnmt.errors import UserError
from attnmt.translator import Translation, Translator

EOS_LABEL = "</s>"


@dataclass(frozen=True)
class PanelTitles:
    """How the panels of a layer x head grid are titled, for figures in another language:
    ``{name}`` is the figure's name, ``{layer}`` and ``{head}`` count from 1."""

    head: str = "{name} layer {layer}, head {head}"
    average: str = "{name} layer {layer}, average"


def draw_matrix(axes, weights: np.ndarray, columns: list[str], rows: list[str], title: str = ""):
    """One heatmap: ``weights (len(rows), len(columns))``, values in [0, 1]."""
    axes.imshow(np.asarray(weights, dtype=np.float32), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
    axes.set_yticks(range(len(rows)), rows, fontsize=8)
    if title:
        axes.set_title(title, fontsize=9)


def cross_attention_figure(translation: Translation, name: str = "cross-attention",
                           titles: PanelTitles = PanelTitles()) -> Figure:
    """The figure for the best hypothesis's attention over the source; ``name`` titles a
    single panel and, through ``titles``, each panel of a grid."""
    hypothesis = translation.best
    if hypothesis.attention is None:
        raise UserError("this model has no attention to draw (decoder: none)")
    columns = translation.source_tokens + [EOS_LABEL]
    rows = hypothesis.tokens + [EOS_LABEL]
    return _grid(hypothesis.attention.transpose(1, 2, 0, 3), columns, rows, name, titles)


def _grid(weights: np.ndarray, columns: list[str], rows: list[str], name: str,
          titles: PanelTitles = PanelTitles()) -> Figure:
    """``weights (layers, heads, rows, columns)`` -> one heatmap per layer and head, with the
    head average as a last column when there are several heads."""
    layers, heads = weights.shape[:2]
    panels = heads + 1 if heads > 1 else 1
    size = (2.0 + 0.3 * len(columns), 2.0 + 0.3 * len(rows))
    figure = Figure(figsize=(size[0] * panels, size[1] * layers), layout="constrained")
    grid = figure.subplots(layers, panels, squeeze=False)
    for layer in range(layers):
        for head in range(panels):
            matrix = weights[layer, head] if head < heads else weights[layer].mean(axis=0)
            template = titles.head if head < heads else titles.average
            title = name if layers == heads == 1 else template.format(name=name, layer=layer + 1, head=head + 1)
            draw_matrix(grid[layer][head], matrix, columns, rows, title)
    return figure


def self_attention_figures(translator: Translator, translation: Translation) -> tuple[Figure, Figure]:
    """Encoder and decoder self-attention grids of a Transformer translation."""
    encoder_weights, decoder_weights = translator.self_attention(translation)
    source = translation.source_tokens + [EOS_LABEL]
    target = ["<s>"] + translation.best.tokens
    return (_grid(encoder_weights, source, source, "encoder self-attention"),
            _grid(decoder_weights, target, target, "decoder self-attention"))


def save(figure: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def plot_sentence(translator: Translator, text: str, output: str | Path, beam: int | None = None,
                  self_attention: bool = False, target_lang: str | None = None) -> list[Path]:
    """Translate ``text`` (into ``target_lang`` for a one-to-many model) and write its
    heatmap(s); returns the PNG paths."""
    if not translator.source_tokenizer.normalize(text):
        raise UserError("nothing to plot: the sentence is empty")
    translation = translator.translate([text], beam=beam, need_attention=True,
                                       target_lang=target_lang)[0]
    paths = [save(cross_attention_figure(translation), output)]
    if self_attention:
        encoder, decoder = self_attention_figures(translator, translation)
        stem = Path(output).with_suffix("")
        paths += [save(encoder, f"{stem}.encoder.png"), save(decoder, f"{stem}.decoder.png")]
    return paths
