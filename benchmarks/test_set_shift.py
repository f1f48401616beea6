"""How far each Multi30k evaluation set lies from the training text, per language.

    python benchmarks/test_set_shift.py [--data-dir DIR] [--langs de en fr cs]
                                        [--extra PREFIX ...]

For each language and each set present (``val``, ``test_2016_flickr``, ``test_2017_flickr``,
``test_2017_mscoco``), compared with ``train`` in that language: the share of the set's
tokens never seen in training, the share of its sentences holding at least one, and the
share of its 4-grams never seen in training, in sacreBLEU's 13a tokens (words and
punctuation), cased, as BLEU counts them. Unseen tokens are what no model of the training
text can spell from memory; unseen 4-grams measure phrasing: BLEU rewards a reference's n-grams, and a
model trained on one collection's captions reproduces that collection's turns of phrase.
``--extra`` adds more text to the training side: ``PREFIX.LANG`` (or ``.gz``) in each
language that has one (task 2's captions, ``DIR/train.1`` ... ``DIR/train.5``, say).
Prints a Markdown table; a set without a file for a language is named and skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from attnmt.data.corpus import find_language_file, read_lines
from attnmt.errors import UserError

SETS = ("val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
ORDER = 4


@dataclass
class Shift:
    """A set's distance from the training text of one language (percentages)."""
    tokens: int
    unseen_tokens: float
    sentences_with_unseen_token: float
    unseen_ngrams: float


def ngrams(tokens: list[str], order: int = ORDER) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + order]) for i in range(len(tokens) - order + 1)]


def known(training: list[list[str]]) -> tuple[set[str], set[tuple[str, ...]]]:
    """The tokens and 4-grams of the training text (a list of token lists)."""
    return ({token for sentence in training for token in sentence},
            {gram for sentence in training for gram in ngrams(sentence)})


def shift(vocabulary: set[str], known_ngrams: set[tuple[str, ...]],
          evaluation: list[list[str]]) -> Shift:
    """How many of ``evaluation``'s tokens, sentences (one unseen token or more) and 4-grams
    the training text (its :func:`known` tokens and 4-grams) lacks."""
    tokens = [token for sentence in evaluation for token in sentence]
    grams = [gram for sentence in evaluation for gram in ngrams(sentence)]
    percent = lambda part, whole: round(100 * part / max(whole, 1), 1)
    return Shift(tokens=len(tokens),
                 unseen_tokens=percent(sum(t not in vocabulary for t in tokens), len(tokens)),
                 sentences_with_unseen_token=percent(
                     sum(any(t not in vocabulary for t in s) for s in evaluation), len(evaluation)),
                 unseen_ngrams=percent(sum(g not in known_ngrams for g in grams), len(grams)))


def tokenized(data_dir: Path, split: str, lang: str) -> list[list[str]] | None:
    """The split's lines in ``lang`` as 13a tokens, or None when the file is absent."""
    try:
        path = find_language_file(data_dir / split, lang)
    except UserError:
        return None
    tokenize = Tokenizer13a()
    return [tokenize(line).split() for line in read_lines(path)]


def training_text(data_dir: Path, lang: str, extra: list[str]) -> list[list[str]] | None:
    """``train`` in ``lang`` and each ``extra`` prefix's file in it, tokenized; None
    without ``train``."""
    training = tokenized(data_dir, "train", lang)
    if training is None:
        return None
    for prefix in extra:
        more = tokenized(Path(prefix).parent, Path(prefix).name, lang)
        if more is None:
            print(f"test_set_shift.py: {lang}: no {prefix}.{lang}; nothing added", file=sys.stderr)
            continue
        print(f"test_set_shift.py: {lang}: {prefix} adds {len(more):,} lines", file=sys.stderr)
        training += more
    return training


def table(data_dir: Path, langs: list[str], extra: list[str] = ()) -> list[str]:
    """Markdown rows, one per language and set present."""
    rows = ["| language | set | tokens | unseen tokens, % | sentences with an unseen token, % "
            f"| unseen {ORDER}-grams, % |", "| --- | --- | --- | --- | --- | --- |"]
    languages_with_training_text = 0
    for lang in langs:
        training = training_text(data_dir, lang, extra)
        if training is None:
            print(f"test_set_shift.py: no train.{lang} in {data_dir}; {lang} is skipped", file=sys.stderr)
            continue
        languages_with_training_text += 1
        vocabulary, known_ngrams = known(training)
        for split in SETS:
            evaluation = tokenized(data_dir, split, lang)
            if evaluation is None:
                print(f"test_set_shift.py: no {split}.{lang} in {data_dir}; skipped", file=sys.stderr)
                continue
            figures = shift(vocabulary, known_ngrams, evaluation)
            rows.append(f"| {lang} | {split} | {figures.tokens:,} | {figures.unseen_tokens} "
                        f"| {figures.sentences_with_unseen_token} | {figures.unseen_ngrams} |")
    if not languages_with_training_text:
        raise UserError(f"no training text in {data_dir} for {', '.join(langs)} (train.LANG or train.LANG.gz)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "data/multi30k"),
                        help="the Multi30k folder (default: $ATTNMT_DATA)")
    parser.add_argument("--langs", nargs="+", default=["de", "en", "fr", "cs"])
    parser.add_argument("--extra", nargs="+", default=[], metavar="PREFIX",
                        help="more training text: PREFIX.LANG in each language that has one")
    args = parser.parse_args()
    try:
        print("\n".join(table(Path(args.data_dir), args.langs, args.extra)))
    except UserError as error:
        sys.exit(f"test_set_shift.py: {error}")


if __name__ == "__main__":
    main()
