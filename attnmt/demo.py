"""``attnmt demo``: the embedded default, with nothing to download.

Generates German -> English number words with ``num2words``, trains a small
Bahdanau attention model within a few minutes on a CPU, reports exact-match
accuracy on the held-out test numbers, prints translations, and draws the
attention of ``vierundzwanzig`` -> ``twenty-four``, whose alignment crosses
(German says the units first).
"""

from __future__ import annotations

from pathlib import Path

from attnmt.config import Config, config_from_dict
from attnmt.data.datasets import load_split
from attnmt.plot import plot_sentence
from attnmt.run import say
from attnmt.train import train_config
from attnmt.translator import Translator

# The same settings as configs/numbers_de_en.yaml (a test keeps them equal).
DEMO_CONFIG = {
    "data": {"dataset": "numbers", "src_lang": "de", "tgt_lang": "en", "tokenizer": "sentencepiece",
             "sp_model": "unigram", "vocab_size": 200, "joint_vocab": False, "max_len": 40,
             "numbers_max": 9999, "numbers_train": 8000, "numbers_valid": 500,
             "numbers_test": 1000},
    "model": {"arch": "rnn", "cell": "gru", "decoder": "bahdanau", "attention": "additive",
              "embed_dim": 128, "hidden_dim": 128, "attention_dim": 128, "encoder_layers": 1,
              "decoder_layers": 1, "bidirectional": True, "dropout": 0.1},
    "train": {"lr": 0.003, "warmup": 100, "schedule": "noam", "batch_tokens": 2000,
              "label_smoothing": 0.0, "max_steps": 1500, "max_minutes": 3.0,
              "validate_every": 250, "log_every": 25, "precision": "fp32"},
    "decode": {"beam": 5, "alpha": 0.0, "max_len_a": 2.0, "max_len_b": 5},
}
EXAMPLES = ["vierundzwanzig", "siebenundneunzig", "dreihundertzwölf", "achttausendfünfhundertsechzig"]


def demo_config() -> Config:
    return config_from_dict(DEMO_CONFIG)


def run_demo(run_dir: Path) -> float:
    """Train (or reuse) the demo run, report, and draw; returns the exact-match accuracy."""
    config = demo_config()
    say(f"training a Bahdanau attention model on German -> English number words in {run_dir} "
        f"(at most {config.train.max_minutes:g} minutes)")
    train_config(config, run_dir)
    translator = Translator.from_run(run_dir)
    test = load_split(config.data, "test")
    outputs = [t.best.text for t in translator.translate(test.source)]
    correct = sum(output == reference for output, reference in zip(outputs, test.target))
    accuracy = correct / len(test.target)
    print(f"exact match on {len(test.target)} held-out numbers: {accuracy:.1%} ({correct} correct)")
    for translation in translator.translate(EXAMPLES):
        print(f"  {translation.source}  ->  {translation.best.text}")
    (image,) = plot_sentence(translator, EXAMPLES[0], run_dir / "attention_vierundzwanzig.png")
    print(f"attention heatmap: {image}")
    return accuracy
