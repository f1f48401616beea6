"""``benchmarks/test_set_shift.py``: unseen tokens, sentences and 4-grams of a set against
the training text."""

import gzip
import importlib.util
from pathlib import Path

import pytest

from attnmt.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("test_set_shift", ROOT / "benchmarks" / "test_set_shift.py")
test_set_shift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_set_shift)


def test_shift_counts_unseen_tokens_sentences_and_four_grams():
    training = [["a", "dog", "runs", "on", "grass"]]
    evaluation = [["a", "dog", "runs", "on"], ["a", "cat", "runs", "on"]]
    figures = test_set_shift.shift(*test_set_shift.known(training), evaluation)
    assert figures.tokens == 8
    assert figures.unseen_tokens == 12.5                # "cat", one of eight
    assert figures.sentences_with_unseen_token == 50.0
    assert figures.unseen_ngrams == 50.0               # "a cat runs on"; "a dog runs on" is known


def test_table_tokenizes_as_bleu_does_and_skips_a_missing_set(tmp_path, capsys):
    (tmp_path / "train.en").write_text("A dog runs on the grass.\nTwo men sit.\n")
    (tmp_path / "val.en").write_text("A dog runs on the grass!\n")
    with gzip.open(tmp_path / "test_2016_flickr.en.gz", "wt") as handle:
        handle.write("Two men sit.\nTwo women sit.\n")
    rows = test_set_shift.table(tmp_path, ["en", "de"])
    # val: 13a splits "grass!" in two, so only "!" is new: 1 of 7 tokens, 1 of 4 4-grams
    assert rows[2] == "| en | val | 7 | 14.3 | 100.0 | 25.0 |"
    # test_2016_flickr: "women" new; "Two women sit ." the only unseen of two 4-grams
    assert rows[3] == "| en | test_2016_flickr | 8 | 12.5 | 50.0 | 50.0 |"
    assert len(rows) == 4
    errors = capsys.readouterr().err
    assert "no test_2017_mscoco.en" in errors and "no train.de" in errors


def test_extra_text_joins_the_training_side_in_its_languages(tmp_path, capsys):
    (tmp_path / "train.en").write_text("Two men sit.\n")
    (tmp_path / "test_2016_flickr.en").write_text("Two women sit.\n")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "captions.en").write_text("Two women stand.\n")
    (tmp_path / "more" / "captions.de").write_text("Zwei Frauen sitzen.\n")
    alone = test_set_shift.table(tmp_path, ["en"])
    joined = test_set_shift.table(tmp_path, ["en"], [str(tmp_path / "more" / "captions")])
    assert alone[2] == "| en | test_2016_flickr | 4 | 25.0 | 100.0 | 100.0 |"
    assert joined[2] == "| en | test_2016_flickr | 4 | 0.0 | 0.0 | 100.0 |"
    errors = capsys.readouterr().err
    assert "captions adds 1 lines" in errors
    assert "no " + str(tmp_path / "more" / "captions") + ".en" not in errors


def test_a_prefix_absent_in_a_language_and_a_folder_without_training_text_are_named(tmp_path, capsys):
    (tmp_path / "train.en").write_text("Two men sit.\n")
    test_set_shift.table(tmp_path, ["en"], [str(tmp_path / "typo")])
    assert f"en: no {tmp_path / 'typo'}.en; nothing added" in capsys.readouterr().err
    with pytest.raises(UserError, match="no training text in .* for de, fr"):
        test_set_shift.table(tmp_path, ["de", "fr"])
