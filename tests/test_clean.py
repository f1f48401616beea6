"""attnmt clean: each filter on a hand-made corpus whose bad pairs are known."""
import subprocess
import sys

import pytest

from attnmt.clean import Bounds, clean_corpus, report
from attnmt.errors import UserError

# (source, target, the filter that must remove the pair or None)
PAIRS = [
    ("Ein Hund rennt.", "A dog runs.", None),
    ("", "An empty source.", "empty"),
    ("Zwei Katzen.", "   ", "empty"),
    ("Ein Hund rennt.", "A dog runs.", "duplicate"),
    ("Hallo\x07 Welt.", "Hello world.", "characters"),
    ("Kaputt \ufffd hier.", "Broken here.", "characters"),
    ("Privat \ue000 hier.", "Private here.", "characters"),
    ("Ein\tTab ist erlaubt.", "A tab is allowed.", None),
    (" ".join(["Wort"] * 251), " ".join(["word"] * 251), "length"),
    ("Ein sehr sehr sehr sehr sehr langer Satz.", "Short.", "ratio"),
    ("Copy  this   line", "copy this line", "identical"),
    ("Eine Frau singt.", "A woman sings.", None),
    ("Eine Frau singt.", "A woman is singing.", None),     # the same source, another target
]


def write_corpus(folder, pairs, suffix=""):
    (folder / f"corpus.de{suffix}").write_text("".join(s + "\n" for s, _, _ in pairs), encoding="utf-8")
    (folder / f"corpus.en{suffix}").write_text("".join(t + "\n" for _, t, _ in pairs), encoding="utf-8")
    return str(folder / "corpus")


def test_each_filter_removes_exactly_its_pairs(tmp_path):
    counts = clean_corpus(write_corpus(tmp_path, PAIRS), str(tmp_path / "clean"), "de", "en")
    kept = [(s, t) for s, t, verdict in PAIRS if verdict is None]
    assert (tmp_path / "clean.de").read_text(encoding="utf-8").splitlines() == [s for s, _ in kept]
    assert (tmp_path / "clean.en").read_text(encoding="utf-8").splitlines() == [t for _, t in kept]
    removed = [line.split("\t") for line in
               (tmp_path / "clean.removed.tsv").read_text(encoding="utf-8").splitlines()]
    expected = [[verdict, str(number), source.replace("\t", " "), target]
                for number, (source, target, verdict) in enumerate(PAIRS, start=1) if verdict]
    assert removed == expected
    assert counts == {"read": 13, "kept": 4, "empty": 2, "duplicate": 1, "characters": 3,
                      "length": 1, "ratio": 1, "identical": 1}
    assert report(counts) == ("read 13 pairs, kept 4; removed 9: empty 2, characters 3, length 1, "
                              "ratio 1, identical 1, duplicate 1")


def test_bounds_are_the_users(tmp_path):
    pairs = [("Ein kurzer Satz.", "A short sentence.", None),
             ("Ja.", "Yes, certainly.", None)]
    corpus = write_corpus(tmp_path, pairs)
    counts = clean_corpus(corpus, str(tmp_path / "strict"), "de", "en",
                          Bounds(min_words=2, max_words=3, max_ratio=1.5))
    assert counts == {"read": 2, "kept": 1, "length": 1}
    assert clean_corpus(corpus, str(tmp_path / "loose"), "de", "en")["kept"] == 2


def test_a_tsv_corpus_is_written_as_a_tsv(tmp_path):
    (tmp_path / "corpus.tsv").write_text("Ein Hund.\tA dog.\nEin Hund.\tA dog.\nJa\tja\n",
                                         encoding="utf-8")
    counts = clean_corpus(str(tmp_path / "corpus.tsv"), str(tmp_path / "clean"), "de", "en")
    assert (tmp_path / "clean.tsv").read_text(encoding="utf-8") == "Ein Hund.\tA dog.\n"
    assert counts == {"read": 3, "kept": 1, "duplicate": 1, "identical": 1}


def test_language_identification_when_asked(tmp_path):
    pairs = [("Ein Hund rennt durch den Schnee.", "A dog runs through the snow.", None),
             ("Zwei Männer sitzen auf einer Bank.", "Deux hommes sont assis sur un banc.", "language"),
             ("Un chien court dans la neige.", "A dog runs through the snow.", "language")]
    corpus = write_corpus(tmp_path, pairs)
    assert clean_corpus(corpus, str(tmp_path / "plain"), "de", "en")["kept"] == 3
    counts = clean_corpus(corpus, str(tmp_path / "checked"), "de", "en", Bounds(langid=True))
    assert counts == {"read": 3, "kept": 1, "language": 2}


def test_refusals_are_one_line_and_write_nothing(tmp_path):
    corpus = write_corpus(tmp_path, PAIRS)
    with pytest.raises(UserError, match="is the input"):
        clean_corpus(corpus, corpus, "de", "en")
    (tmp_path / "corpus.en").write_text("one line\n")
    with pytest.raises(UserError, match="line counts differ"):
        clean_corpus(corpus, str(tmp_path / "out"), "de", "en")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.de", "corpus.en"]
    done = subprocess.run([sys.executable, "-m", "attnmt", "clean", corpus, "-o", str(tmp_path / "o"),
                           "--src-lang", "de", "--tgt-lang", "en", "--max-ratio", "0.5"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "--max-ratio" in done.stderr
