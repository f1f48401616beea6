import subprocess
import sys

import numpy as np
import pytest

from attnmt.config import load_config
from attnmt.data.binarized import BinarizedSplit, prepare
from attnmt.data.numbers import numbers_corpus
from attnmt.errors import UserError
from attnmt.run import prepare_run
from attnmt.train import train

from test_train import losses

FILES_CONFIG = """
data:
  dataset: files
  train: {folder}/train
  valid: {folder}/valid
  tokenizer: sentencepiece
  vocab_size: 80
  joint_vocab: false
  max_len: 12
model:
  arch: transformer
  d_model: 32
  heads: 2
  ffn_dim: 64
  encoder_layers: 1
  decoder_layers: 1
train:
  lr: 0.003
  warmup: 20
  batch_tokens: 400
  max_steps: 30
  validate_every: 1000
  log_every: 1
  threads: 1
  precision: fp32
"""


@pytest.fixture
def corpus_config(tmp_path):
    sizes = {"train": 700, "valid": 30, "test": 0}
    for split in ("train", "valid"):
        corpus = numbers_corpus(split, "de", "en", 9999, sizes, seed=5)
        source = corpus.source + ([""] if split == "train" else [])     # one empty pair to drop
        target = corpus.target + (["zero"] if split == "train" else [])
        (tmp_path / f"{split}.de").write_text("\n".join(source) + "\n")
        (tmp_path / f"{split}.en").write_text("\n".join(target) + "\n")
    path = tmp_path / "files.yaml"
    path.write_text(FILES_CONFIG.format(folder=tmp_path))
    return path


def test_prepare_then_train_equals_training_from_raw_files(corpus_config, tmp_path):
    report = prepare_run(corpus_config, tmp_path / "prepared")
    assert report["read"] == 701 and report["empty"] == 1 and report["kept"] + report["long"] == 700
    split = BinarizedSplit(tmp_path / "prepared")
    assert isinstance(split.tokens["src"], np.memmap) and len(split) == report["kept"]
    train(corpus_config, tmp_path / "prepared")
    train(corpus_config, tmp_path / "raw")
    assert len(losses(tmp_path / "raw")) == 30
    assert losses(tmp_path / "prepared") == losses(tmp_path / "raw")


def test_extra_source_language_is_added_to_training_alike_prepared_or_raw(corpus_config, tmp_path):
    french = numbers_corpus("train", "fr", "en", 9999, {"train": 700, "valid": 30, "test": 0}, seed=5)
    (tmp_path / "train.fr").write_text("\n".join(french.source + [""]) + "\n")    # the same lines
    extra = ["data.extra_src_langs=[fr]"]
    report = prepare_run(corpus_config, tmp_path / "prepared", extra)
    assert report["read"] == 2 * 701 and report["empty"] == 2
    train(corpus_config, tmp_path / "prepared", extra)
    train(corpus_config, tmp_path / "raw", extra)
    train(corpus_config, tmp_path / "plain")
    assert losses(tmp_path / "prepared") == losses(tmp_path / "raw") != losses(tmp_path / "plain")


def test_interrupted_prepare_leaves_nothing_half_done(corpus_config, tmp_path, monkeypatch):
    import attnmt.data.binarized as binarized

    calls = {"n": 0}
    original = binarized._SideWriter.add

    def crash_later(self, ids):
        calls["n"] += 1
        if calls["n"] > 100:
            raise KeyboardInterrupt
        original(self, ids)

    monkeypatch.setattr(binarized._SideWriter, "add", crash_later)
    config = load_config(corpus_config)
    with pytest.raises(KeyboardInterrupt):
        prepare(config, tmp_path / "run", chunk_pairs=50)
    assert not (tmp_path / "run" / "data" / "train.json").exists()
    assert not (tmp_path / "run" / "data" / "train.src.bin").exists()
    monkeypatch.setattr(binarized._SideWriter, "add", original)
    assert prepare(config, tmp_path / "run", chunk_pairs=50)["read"] == 701


def test_streamed_corpus_with_unequal_files_is_refused(corpus_config, tmp_path):
    with open(tmp_path / "train.en", "a") as handle:
        handle.write("one more\n")
    with pytest.raises(UserError, match=r"line counts differ: .*train.de has 701 lines, .*train.en "
                                        r"has 702"):
        prepare(load_config(corpus_config), tmp_path / "run")


def test_prepare_command_reports(corpus_config, tmp_path):
    result = subprocess.run([sys.executable, "-m", "attnmt", "prepare", str(corpus_config),
                             "--run", str(tmp_path / "cli")], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("read 701 pairs, kept ") and "pairs/s" in result.stdout
