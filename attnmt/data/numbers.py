"""The embedded ``numbers`` dataset: number words in two languages, generated with ``num2words``.

German ``vierundzwanzig`` -> English ``twenty-four``: German says the units before the
tens, so the alignment crosses, which is exactly what attention has to learn. Integers
are drawn without replacement from ``0..maximum`` by a seeded permutation, so the
train, valid and test splits are disjoint and the same on every machine.
"""

from __future__ import annotations

import functools
import random

from num2words import CONVERTER_CLASSES, num2words

from attnmt.data.corpus import ParallelCorpus
from attnmt.errors import UserError

SPLITS = ("train", "valid", "test")


def split_integers(maximum: int, sizes: dict[str, int], seed: int) -> dict[str, list[int]]:
    """Disjoint lists of integers from ``0..maximum`` for each split, fixed by ``seed``."""
    wanted = sum(sizes.values())
    if wanted > maximum + 1:
        raise UserError(f"numbers dataset: {wanted} train+valid+test examples requested but only "
                        f"{maximum + 1} integers in 0..{maximum}; raise data.numbers_max")
    drawn = random.Random(seed).sample(range(maximum + 1), wanted)
    splits, start = {}, 0
    for split in SPLITS:
        splits[split] = drawn[start:start + sizes[split]]
        start += sizes[split]
    return splits


def numbers_corpus(split: str, src_lang: str, tgt_lang: str, maximum: int,
                   sizes: dict[str, int], seed: int) -> ParallelCorpus:
    for lang in (src_lang, tgt_lang):
        if lang not in CONVERTER_CLASSES:
            raise UserError(f"numbers dataset: num2words has no language {lang!r}; it has "
                            f"{', '.join(sorted(CONVERTER_CLASSES))}")
    integers = split_integers(maximum, sizes, seed)[split]
    return ParallelCorpus([number_words(n, src_lang) for n in integers],
                          [number_words(n, tgt_lang) for n in integers], f"numbers/{split}")


@functools.cache
def number_words(integer: int, lang: str) -> str:
    """``num2words`` is slow (about 0.1 ms a word), and a process that trains several models
    on the dataset, as the tutorial does, would spell the same integers again each time."""
    return num2words(integer, lang=lang)
