import os
from pathlib import Path

import pytest
import torch

from attnmt.config import ModelConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model

SMALL_TRANSFORMER = dict(arch="transformer", d_model=16, heads=4, ffn_dim=32, encoder_layers=2,
                         decoder_layers=2, dropout=0.0, attention_dropout=0.0)
SMALL_RNN = dict(arch="rnn", embed_dim=16, hidden_dim=16, attention_dim=12, encoder_layers=2,
                 decoder_layers=2, dropout=0.0, max_source_len=12)

# Every architecture and every valid attention choice, by a readable id.
ARCHITECTURES = {
    "transformer-post": dict(SMALL_TRANSFORMER),
    "transformer-pre-learned": dict(SMALL_TRANSFORMER, norm="pre", positions="learned",
                                    tie_embeddings="all"),
    "rnn-none-gru": dict(SMALL_RNN, decoder="none"),
    "rnn-none-lstm-uni": dict(SMALL_RNN, decoder="none", cell="lstm", bidirectional=False),
    "bahdanau-additive": dict(SMALL_RNN, decoder="bahdanau", attention="additive"),
    "bahdanau-general-lstm": dict(SMALL_RNN, decoder="bahdanau", attention="general", cell="lstm"),
    "bahdanau-dot-uni": dict(SMALL_RNN, decoder="bahdanau", attention="dot", bidirectional=False),
    "bahdanau-location-rnn": dict(SMALL_RNN, decoder="bahdanau", attention="location", cell="rnn"),
    "bahdanau-local-additive": dict(SMALL_RNN, decoder="bahdanau", attention="additive",
                                    local_window=2),
    "luong-general": dict(SMALL_RNN, decoder="luong", attention="general"),
    "luong-dot-uni": dict(SMALL_RNN, decoder="luong", attention="dot", bidirectional=False),
    "luong-scaled-dot-uni-lstm": dict(SMALL_RNN, decoder="luong", attention="scaled_dot",
                                      bidirectional=False, cell="lstm"),
    "luong-additive-no-feed": dict(SMALL_RNN, decoder="luong", attention="additive",
                                   input_feeding=False),
    "luong-location": dict(SMALL_RNN, decoder="luong", attention="location"),
    "luong-local-general": dict(SMALL_RNN, decoder="luong", attention="general", local_window=2),
}

VOCAB = 11

# A tiny Transformer on number words: trains in seconds, learns something.
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
  device: cpu
"""


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def make_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**ARCHITECTURES[name]), VOCAB, VOCAB).eval()


def toy_batch(seed: int = 0):
    """Source (3, 7) and target (3, 6) batches with padding; targets start with BOS."""
    generator = torch.Generator().manual_seed(seed)
    src_lengths, tgt_lengths = [7, 4, 2], [6, 3, 5]
    src = torch.full((3, 7), PAD_ID)
    tgt = torch.full((3, 6), PAD_ID)
    for row, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        src[row, :s - 1] = torch.randint(4, VOCAB, (s - 1,), generator=generator)
        src[row, s - 1] = EOS_ID
        tgt[row, 0] = BOS_ID
        tgt[row, 1:t] = torch.randint(4, VOCAB, (t - 1,), generator=generator)
    return src, padding_mask(src, PAD_ID), tgt, target_mask(tgt, PAD_ID)


@pytest.fixture(params=sorted(ARCHITECTURES))
def arch_name(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """Three tiny trained runs on number words, shared by the translator, plot and serve tests:
    a Transformer (max_positions 40), a Bahdanau GRU and a no-attention GRU."""
    from attnmt.train import train

    folder = tmp_path_factory.mktemp("tiny_runs")
    config = folder / "tiny.yaml"
    config.write_text(TINY)
    steps = ["train.max_steps=60", "train.validate_every=60"]
    rnn = ["model.arch=rnn", "model.embed_dim=16", "model.hidden_dim=16", "model.attention_dim=16"]
    return {"transformer": train(config, folder / "transformer", steps + ["model.max_positions=40"]),
            "rnn": train(config, folder / "rnn", steps + rnn),
            "none": train(config, folder / "none", steps + rnn + ["model.decoder=none"])}


@pytest.fixture(scope="session")
def char_run(tmp_path_factory):
    """A tiny character-level Transformer on number words (its outputs are letters)."""
    from attnmt.train import train

    folder = tmp_path_factory.mktemp("char_run")
    (folder / "tiny.yaml").write_text(TINY)
    return train(folder / "tiny.yaml", folder / "run",
                 ["data.tokenizer=char", "data.vocab_size=60", "train.max_steps=30",
                  "train.validate_every=30"])


@pytest.fixture(scope="session")
def one_to_many_run(tmp_path_factory):
    """A tiny Transformer trained on German number words into English and French (target
    tags <2en>, <2fr>): enough to tell the two languages apart."""
    from attnmt.train import train

    folder = tmp_path_factory.mktemp("one_to_many")
    (folder / "tiny.yaml").write_text(TINY)
    return train(folder / "tiny.yaml", folder / "run",
                 ["data.extra_tgt_langs=[fr]", "data.joint_vocab=true", "data.vocab_size=120",
                  "train.max_steps=300", "train.validate_every=300"])


@pytest.fixture(scope="session")
def french_run(tmp_path_factory):
    """A tiny Transformer on French number words into English (a second source language)."""
    from attnmt.train import train

    folder = tmp_path_factory.mktemp("french_run")
    (folder / "tiny.yaml").write_text(TINY)
    return train(folder / "tiny.yaml", folder / "run",
                 ["data.src_lang=fr", "train.max_steps=30", "train.validate_every=30"])


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The Multi30k folder named by $ATTNMT_DATA. Without it a test skips, except in CI
    (``CI=true``), which provides the data: there a missing folder fails the run."""
    folder = Path(os.environ.get("ATTNMT_DATA", "")).expanduser()
    if os.environ.get("ATTNMT_DATA") and (folder / "val.de.gz").is_file():
        return folder
    message = (f"Multi30k not found (ATTNMT_DATA={os.environ.get('ATTNMT_DATA', '')!r}); "
               "set ATTNMT_DATA to the folder of its .gz files")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (CI provides it: a missing folder is an error there)")
    pytest.skip(message)
