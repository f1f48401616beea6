"""``attnmt experiment NAME``: the claims of the notes (docs/experiments.md), one function each.

Every experiment trains (or measures) its variants with the same data, seed and budget,
and writes into its output folder ``results.json`` (raw numbers), PNG figures and
``report.md`` (the table, the figures, the exact configs and the command that
reproduces it).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import yaml
from matplotlib.figure import Figure

from attnmt.config import ModelConfig, config_from_dict
from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.data.tensors import pad, source_tensor
from attnmt.data.datasets import load_split
from attnmt.errors import UserError
from attnmt.evaluate import bleu_by_length, corpus_bleu
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model
from attnmt.run import RunDirectory
from attnmt.train import train_config
from attnmt.translator import Translator


@dataclass
class Setting:
    """Where and how an experiment runs."""
    out: Path
    minutes: float                     # the whole experiment's budget
    data: dict                         # the config's data section
    command: str                       # the command line that reproduces it


@dataclass
class Result:
    columns: list[str]
    rows: list[list]
    figures: list[str]
    configs: dict
    notes: str = ""


# --- shared pieces ----------------------------------------------------------------------------

SMALL_TRAIN = {"lr": 0.001, "warmup": 400, "batch_tokens": 4096, "validate_every": 1000,
               "log_every": 50, "label_smoothing": 0.1, "keep_checkpoints": 1}
RNN = {"arch": "rnn", "cell": "gru", "embed_dim": 256, "hidden_dim": 256, "attention_dim": 256,
       "encoder_layers": 1, "decoder_layers": 1, "bidirectional": True, "dropout": 0.2,
       "tie_embeddings": "all"}
TRANSFORMER = {"arch": "transformer", "d_model": 256, "heads": 4, "ffn_dim": 1024,
               "encoder_layers": 3, "decoder_layers": 3, "dropout": 0.1, "tie_embeddings": "all"}


def train_variant(setting: Setting, name: str, model: dict, minutes: float,
                  train: dict | None = None) -> tuple[Translator, dict]:
    """Train one variant for ``minutes`` into ``out/runs/name``; its translator and config."""
    raw = {"data": setting.data, "model": model,
           "train": {**SMALL_TRAIN, **(train or {}), "max_minutes": minutes}}
    train_config(config_from_dict(raw), setting.out / "runs" / name)
    return Translator.from_run(setting.out / "runs" / name), raw


def test_bleu(translator: Translator, sources: list[str], references: list[str]) -> tuple[float, list[str]]:
    """Greedy-decoded sacreBLEU (greedy keeps the comparison about the models, not the search)."""
    outputs = [t.best.text for t in translator.translate(sources, beam=1)]
    return corpus_bleu(outputs, references), outputs


def perplexity(run: Path) -> float:
    """The last validation perplexity in a run's log."""
    return RunDirectory(run).log_values("valid_ppl")[-1][1]


def joined(corpus, count: int) -> tuple[list[str], list[str]]:
    """Long-sentence test: every ``count`` consecutive pairs joined into one."""
    sources, targets = [], []
    for start in range(0, len(corpus.source) - count + 1, count):
        sources.append(" ".join(corpus.source[start:start + count]))
        targets.append(" ".join(corpus.target[start:start + count]))
    return sources, targets


def line_figure(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, tuple[list, list]],
                log_x: bool = False, log_y: bool = False) -> str:
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    for label, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o", label=label)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if log_x:
        axes.set_xscale("log", base=2)
    if log_y:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=90)
    return path.name


# --- 1. bottleneck ----------------------------------------------------------------------------

def bottleneck(setting: Setting) -> Result:
    """No attention vs Bahdanau vs Luong vs Transformer: BLEU by source length."""
    variants = {"no attention": {**RNN, "decoder": "none", "encoder_layers": 2, "decoder_layers": 2},
                "Bahdanau": {**RNN, "decoder": "bahdanau", "attention": "additive"},
                "Luong": {**RNN, "decoder": "luong", "attention": "general", "cell": "lstm"},
                "Transformer": TRANSFORMER}
    test = load_split(config_from_dict({"data": setting.data}).data, "test")
    lengths = [len(s.split()) for s in test.source]
    rows, by_length, by_join, configs = [], {}, {}, {}
    for name, model in variants.items():
        translator, configs[name] = train_variant(setting, name.replace(" ", "_"), model,
                                                  setting.minutes / len(variants))
        bleu, outputs = test_bleu(translator, test.source, test.target)
        buckets = bleu_by_length(outputs, test.target, lengths, edges=(8, 12, 16, 20))
        by_length[name] = ([b[0] for b in buckets], [b[2] for b in buckets])
        joins = [test_bleu(translator, *joined(test, count))[0] for count in (1, 2, 3, 4)]
        by_join[name] = ([1, 2, 3, 4], joins)
        rows.append([name, translator.model.num_parameters(), round(bleu, 2),
                     *[round(b, 2) for b in joins[1:]]])
    figures = [line_figure(setting.out / "bleu_by_length.png", "BLEU by source length",
                           "source words", "BLEU", by_length),
               line_figure(setting.out / "bleu_by_joined.png", "BLEU on joined test sentences",
                           "test sentences joined", "BLEU", by_join)]
    return Result(["model", "parameters", "BLEU", "BLEU x2 joined", "BLEU x3", "BLEU x4"], rows,
                  figures, configs, "Buckets: " + json.dumps(by_length))


# --- 2. gradients -----------------------------------------------------------------------------

def gradients(setting: Setting) -> Result:
    """Gradient norm reaching each source position, with and without attention."""
    # One direction, so that the only path from the last source word to the first runs
    # through every encoder step (a backward RNN would hand the first word to the decoder).
    unidirectional = {**RNN, "bidirectional": False, "dropout": 0.0}
    variants = {"no attention": {**unidirectional, "decoder": "none"},
                "Bahdanau": {**unidirectional, "decoder": "bahdanau", "attention": "additive"}}
    valid = load_split(config_from_dict({"data": setting.data}).data, "valid")
    series, rows, configs = {}, [], {}
    for name, model in variants.items():
        translator, configs[name] = train_variant(setting, name.replace(" ", "_"), model,
                                                  setting.minutes / len(variants))
        norms = source_gradient_norms(translator, valid.source[:256], valid.target[:256])
        series[name] = (list(range(len(norms))), norms)
        rows.append([name, *[f"{norms[d]:.3g}" if d < len(norms) else "" for d in (0, 5, 10, 15)]])
    figure = line_figure(setting.out / "gradient_by_distance.png",
                         "gradient norm at the source embeddings", "distance from the last word",
                         "mean gradient norm", series, log_y=True)
    return Result(["model", "distance 0", "5", "10", "15"], rows, [figure], configs)


def source_gradient_norms(translator: Translator, sources: list[str], targets: list[str]) -> list[float]:
    """Mean norm of d(loss)/d(source embedding) by distance from the sentence end."""
    model = translator.model.train()
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["embedded"] = output

    handle = model.encoder.embedding.register_forward_hook(keep)
    try:
        src, src_mask = source_tensor(translator.source_tokenizer.encode_batch(sources))
        ids = translator.target_tokenizer.encode_batch(targets)
        tgt_in, tgt_out = pad(ids, prefix=[BOS_ID]), pad(ids, suffix=[EOS_ID])
        logits = model(src, src_mask, tgt_in, target_mask(tgt_in, PAD_ID))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                                                 ignore_index=PAD_ID, reduction="sum")
        loss.backward()
    finally:
        handle.remove()
        model.eval()
    norms = captured["embedded"].grad.norm(dim=-1)                    # (B, S)
    lengths = src_mask.sum(-1).squeeze(1).tolist()
    totals: dict[int, list[float]] = {}
    for row, length in enumerate(lengths):
        for position in range(length - 1):                           # words, not the EOS
            totals.setdefault(length - 2 - position, []).append(float(norms[row, position]))
    return [sum(v) / len(v) for _, v in sorted(totals.items()) if len(v) >= 8]


# --- 3. scaling -------------------------------------------------------------------------------

def scaling(setting: Setting) -> Result:
    """Dot product with and without 1/sqrt(d_k): saturation at init, and training."""
    rows, figures_data, configs = [], {"scaled": ([], []), "unscaled": ([], [])}, {}
    dims = (16, 64, 256, 1024)
    for d_k in dims:
        for scaled in (True, False):
            entropy, max_weight, grad_norm = softmax_statistics(d_k, scaled)
            name = f"d{d_k}_{'scaled' if scaled else 'unscaled'}"
            model = {**TRANSFORMER, "d_model": d_k, "heads": 1, "ffn_dim": 2 * d_k,
                     "encoder_layers": 1, "decoder_layers": 1, "scale_attention": scaled,
                     "dropout": 0.1}
            translator, configs[name] = train_variant(setting, name, model,
                                                      setting.minutes / (2 * len(dims)))
            ppl = perplexity(setting.out / "runs" / name)
            key = "scaled" if scaled else "unscaled"
            figures_data[key][0].append(d_k)
            figures_data[key][1].append(math.log(ppl))
            rows.append([d_k, "yes" if scaled else "no", f"{entropy:.3f}", f"{max_weight:.3f}",
                         f"{grad_norm:.3g}", f"{math.log(ppl):.3f}"])
    figure = line_figure(setting.out / "valid_loss_by_dk.png", "validation loss after the budget",
                         "d_k", "validation loss (nats)", figures_data, log_x=True)
    return Result(["d_k", "1/sqrt(d_k)", "entropy at init (nats)", "max weight at init",
                   "grad norm of scores", "valid loss"], rows, [figure], configs)


def softmax_statistics(d_k: int, scaled: bool, queries: int = 64, keys: int = 32,
                       trials: int = 16) -> tuple[float, float, float]:
    """Softmax entropy, max weight and score-gradient norm for unit-variance q, k at init."""
    generator = torch.Generator().manual_seed(d_k)
    q = torch.randn(trials, queries, d_k, generator=generator)
    k = torch.randn(trials, keys, d_k, generator=generator)
    scores = (q @ k.transpose(1, 2)) / (math.sqrt(d_k) if scaled else 1.0)
    scores.requires_grad_(True)
    weights = torch.softmax(scores, dim=-1)
    upstream = torch.randn(weights.shape, generator=generator)
    (weights * upstream).sum().backward()
    weights = weights.detach()
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
    return float(entropy), float(weights.max(-1).values.mean()), float(scores.grad.norm(dim=-1).mean())


# --- 4. scorers -------------------------------------------------------------------------------

def scorers(setting: Setting) -> Result:
    """dot, general, additive, location, local-p and scaled-dot on the same Luong RNN."""
    base = {**RNN, "decoder": "luong", "cell": "lstm", "bidirectional": False, "max_source_len": 128}
    variants = {"dot": {"attention": "dot"}, "general": {"attention": "general"},
                "additive": {"attention": "additive"}, "location": {"attention": "location"},
                "local-p (general)": {"attention": "general", "local_window": 5},
                "scaled-dot": {"attention": "scaled_dot"}}
    test = load_split(config_from_dict({"data": setting.data}).data, "test")
    rows, configs = [], {}
    for name, choice in variants.items():
        run = name.replace(" ", "_").replace("(", "").replace(")", "")
        translator, configs[name] = train_variant(setting, run, {**base, **choice},
                                                  setting.minutes / len(variants))
        start = time.perf_counter()
        bleu, _ = test_bleu(translator, test.source, test.target)
        sentences_per_s = len(test.source) / (time.perf_counter() - start)
        speeds = [value for _, value in RunDirectory(setting.out / "runs" / run).log_values("tokens_per_s")]
        rows.append([name, translator.model.num_parameters(), round(bleu, 2),
                     round(perplexity(setting.out / "runs" / run), 2),
                     round(sum(speeds) / len(speeds)) if speeds else "n/a", round(sentences_per_s)])
    return Result(["score", "parameters", "BLEU", "valid perplexity", "train tokens/s",
                   "decode sentences/s"], rows, [], configs)


# --- 5. parallelism ---------------------------------------------------------------------------

def parallelism(setting: Setting) -> Result:
    """Encoding and training-step time as the source grows, RNN vs Transformer (synthetic).

    The claim is about sequential steps, so beside the times on all threads it
    measures what a second thread buys each model: an RNN layer takes one step per
    source position and each step is too small to share, while a self-attention layer
    is a few large products over every position at once.
    """
    lengths = (16, 32, 64, 128, 256, 512) if setting.minutes >= 1 else (16, 32, 64)
    models = {"GRU encoder-decoder (Bahdanau)": ModelConfig(**{**RNN, "decoder": "bahdanau",
                                                               "attention": "additive",
                                                               "dropout": 0.0}),
              "Transformer": ModelConfig(**{**TRANSFORMER, "dropout": 0.0, "max_positions": 1024})}
    threads = torch.get_num_threads()
    rows, encode_series, speedup_series = [], {}, {}
    for name, config in models.items():
        torch.manual_seed(0)
        model = build_model(config, 1000, 1000)
        encode_series[name], speedup_series[name] = (list(lengths), []), (list(lengths), [])
        for length in lengths:
            src = torch.randint(4, 1000, (8, length))
            tgt = torch.randint(4, 1000, (8, 16))
            src_mask = padding_mask(src, 0)
            encode = _median_time(lambda: model.encode(src, src_mask), no_grad=True)
            torch.set_num_threads(1)
            try:
                encode_one_thread = _median_time(lambda: model.encode(src, src_mask), no_grad=True)
            finally:
                torch.set_num_threads(threads)
            step = _median_time(lambda: model(src, src_mask, tgt, target_mask(tgt, 0)).sum().backward())
            sequential = config.encoder_layers * (1 if config.arch == "transformer" else length)
            encode_series[name][1].append(encode * 1e3)
            speedup_series[name][1].append(encode_one_thread / encode)
            rows.append([name, length, sequential, f"{encode_one_thread * 1e3:.1f}",
                         f"{encode * 1e3:.1f}", f"{encode_one_thread / encode:.2f}",
                         f"{step * 1e3:.1f}"])
    figures = [line_figure(setting.out / "encode_time.png", f"encoding time, batch 8, {threads} threads",
                           "source length", "ms", encode_series, log_x=True),
               line_figure(setting.out / "thread_speedup.png",
                           f"encoding speed-up from 1 to {threads} threads",
                           "source length", "speed-up", speedup_series, log_x=True)]
    return Result(["model", "source length", "sequential steps (encoder)", "encode ms, 1 thread",
                   f"encode ms, {threads} threads", "speed-up", f"train step ms, {threads} threads"],
                  rows, figures, {})


def _median_time(function: Callable, no_grad: bool = False, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats + 1):                                     # the first run warms up
        start = time.perf_counter()
        with torch.no_grad() if no_grad else torch.enable_grad():
            function()
        times.append(time.perf_counter() - start)
    times = times[1:]
    return sorted(times)[len(times) // 2]


# --- 6. heads ---------------------------------------------------------------------------------

def heads(setting: Setting) -> Result:
    """1, 2, 4, 8, 16 heads at d_model 256: BLEU, perplexity, entropy of each head."""
    counts = (1, 2, 4, 8, 16)
    test = load_split(config_from_dict({"data": setting.data}).data, "test")
    rows, configs, entropy_series = [], {}, {}
    for count in counts:
        translator, configs[f"{count} heads"] = train_variant(
            setting, f"heads_{count}", {**TRANSFORMER, "heads": count}, setting.minutes / len(counts))
        bleu, _ = test_bleu(translator, test.source, test.target)
        entropies = head_entropies(translator, test.source[:200])
        entropy_series[f"{count} heads"] = (list(range(1, count + 1)), entropies)
        rows.append([count, round(bleu, 2), round(perplexity(setting.out / "runs" / f"heads_{count}"), 2),
                     f"{min(entropies):.2f}-{max(entropies):.2f}"])
    figure = line_figure(setting.out / "head_entropy.png",
                         "cross-attention entropy per head (last layer)", "head",
                         "mean entropy (nats)", entropy_series)
    return Result(["heads", "BLEU", "valid perplexity", "head entropy range (nats)"], rows,
                  [figure], configs)


def head_entropies(translator: Translator, sources: list[str]) -> list[float]:
    """Mean entropy of each last-layer cross-attention head over the output tokens."""
    totals, count = None, 0
    for translation in translator.translate(sources, beam=1, need_attention=True):
        attention = translation.best.attention                      # (T, layers, heads, S)
        if attention is None:
            continue
        last = torch.from_numpy(attention[:, -1])                   # (T, heads, S)
        entropy = -(last * last.clamp_min(1e-30).log()).sum(-1)     # (T, heads)
        totals = entropy.sum(0) if totals is None else totals + entropy.sum(0)
        count += entropy.size(0)
    return (totals / count).tolist()


# --- running and reporting --------------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    name: str
    claim: str
    minutes: float
    run: Callable[[Setting], Result]


EXPERIMENTS = (
    Experiment("bottleneck", "attention beats the fixed-vector bottleneck, more so on long "
                             "sentences (Bahdanau 2014)", 30, bottleneck),
    Experiment("gradients", "attention gives short gradient paths to every source state", 10,
               gradients),
    Experiment("scaling", "unscaled dot products saturate the softmax as d_k grows; "
                          "1/sqrt(d_k) fixes it", 30, scaling),
    Experiment("scorers", "additive works for any sizes, scaled dot-product is cheaper "
                          "(Luong 2015 Table 4)", 30, scorers),
    Experiment("parallelism", "self-attention has no sequential dependency inside a layer", 5,
               parallelism),
    Experiment("heads", "several heads attend from several subspaces (Vaswani 2017 Table 3 A)",
               30, heads),
)


def find_experiment(name: str) -> Experiment:
    for experiment in EXPERIMENTS:
        if experiment.name == name:
            return experiment
    raise UserError(f"unknown experiment {name!r}; choose one of "
                    f"{', '.join(e.name for e in EXPERIMENTS)} (or 'list')")


def run_experiment(experiment: Experiment, setting: Setting) -> Path:
    """Run, then write results.json and report.md into ``setting.out``."""
    setting.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = experiment.run(setting)
    minutes = (time.perf_counter() - start) / 60
    (setting.out / "results.json").write_text(json.dumps(
        {"experiment": experiment.name, "columns": result.columns, "rows": result.rows,
         "minutes": round(minutes, 1), "budget_minutes": setting.minutes, "notes": result.notes},
        indent=1))
    report = [f"# Experiment `{experiment.name}`", "", f"Claim: {experiment.claim}.", "",
              f"Reproduce: `{setting.command}` ({minutes:.1f} minutes here).", "",
              "| " + " | ".join(result.columns) + " |",
              "|" + "---|" * len(result.columns),
              *["| " + " | ".join(str(cell) for cell in row) + " |" for row in result.rows], ""]
    report += [f"![{name}]({name})" for name in result.figures]
    if result.configs:
        report += ["", "## Configs", "", "```yaml",
                   yaml.safe_dump(result.configs, sort_keys=False).rstrip(), "```"]
    path = setting.out / "report.md"
    path.write_text("\n".join(report) + "\n", encoding="utf-8")
    return path
