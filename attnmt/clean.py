"""``attnmt clean``: drop the pairs of a parallel corpus that would teach a model nonsense.

Each pair is checked by the filters in :data:`FILTERS` order and removed by the first that
names it; a pair no filter names is kept, unchanged. The filters a user expects of any
corpus are on by default (a side empty, control or non-printing characters, lengths and
their ratio, the source copied into the target, exact duplicates); language
identification (``--langid``, py3langid, whose model ships in its wheel) is asked for.
The kept pairs are written as the corpus was read (two language files, or a ``.tsv``),
the removed ones to ``OUT.removed.tsv`` with the filter that removed each, for
inspection. The corpus streams: only the hashes of the pairs seen are kept in memory.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from attnmt.data.corpus import iter_parallel
from attnmt.errors import UserError

FILTERS = ("empty", "characters", "length", "ratio", "identical", "duplicate", "language")
NON_PRINTING = {"Cc", "Cs", "Co", "Cn"}       # controls, surrogates, private use, unassigned


@dataclass(frozen=True)
class Bounds:
    min_words: int = 1            # per side
    max_words: int = 250          # per side
    max_ratio: float = 3.0        # longer side's words over the shorter's
    langid: bool = False          # each side must be identified as its language


def has_non_printing(text: str) -> bool:
    """Control characters other than the tab, and what cannot be printed: private-use and
    unassigned code points, and U+FFFD, the mark of a decoding that went wrong."""
    return any(character != "\t" and (unicodedata.category(character) in NON_PRINTING
                                      or character == "\ufffd") for character in text)


class Cleaner:
    """Names the filter that removes a pair, or None to keep it (:meth:`verdict`)."""

    def __init__(self, src_lang: str, tgt_lang: str, bounds: Bounds):
        self.langs, self.bounds = (src_lang, tgt_lang), bounds
        self.seen: set[bytes] = set()
        self.identifier = _identifier(self.langs) if bounds.langid else None

    def verdict(self, source: str, target: str) -> str | None:
        bounds = self.bounds
        if not source.strip() or not target.strip():
            return "empty"
        if has_non_printing(source) or has_non_printing(target):
            return "characters"
        lengths = len(source.split()), len(target.split())
        if min(lengths) < bounds.min_words or max(lengths) > bounds.max_words:
            return "length"
        if max(lengths) > bounds.max_ratio * min(lengths):
            return "ratio"
        if " ".join(source.casefold().split()) == " ".join(target.casefold().split()):
            return "identical"
        key = hashlib.blake2b(f"{source}\t{target}".encode(), digest_size=16).digest()
        if key in self.seen:
            return "duplicate"
        self.seen.add(key)
        if self.identifier is not None and any(
                self.identifier.classify(text)[0] != lang
                for text, lang in zip((source, target), self.langs)):
            return "language"
        return None


def _identifier(langs: tuple[str, str]):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    unknown = [lang for lang in langs if lang not in identifier.labels]
    if unknown:
        raise UserError(f"--langid: py3langid does not know the language {unknown[0]!r}")
    return identifier


def output_paths(out: str, src_lang: str, tgt_lang: str, tsv: bool) -> list[Path]:
    if tsv:
        return [Path(out if out.endswith(".tsv") else f"{out}.tsv")]
    return [Path(f"{out}.{src_lang}"), Path(f"{out}.{tgt_lang}")]


def clean_corpus(corpus: str, out: str, src_lang: str, tgt_lang: str,
                 bounds: Bounds = Bounds()) -> Counter:
    """Write the kept pairs of ``corpus`` (a prefix, or a ``.tsv``) under ``out`` and the
    removed ones to ``out.removed.tsv``; returns the pairs read, kept and removed by filter.
    Every file is written beside its final name and renamed at the end, so an interrupted
    run leaves nothing half-written; an output that is an input is refused first."""
    from attnmt.streaming import refuse_overwriting

    tsv = corpus.endswith((".tsv", ".tsv.gz"))
    outputs = output_paths(out, src_lang, tgt_lang, tsv)
    removed_path = Path(f"{out.removesuffix('.tsv')}.removed.tsv")
    inputs = [corpus] if tsv else [str(p) for lang in (src_lang, tgt_lang)
                                   for p in (Path(f"{corpus}.{lang}"), Path(f"{corpus}.{lang}.gz"))]
    for source in inputs:
        refuse_overwriting(source, [*outputs, removed_path])
    if not outputs[0].parent.is_dir():
        raise UserError(f"folder not found: {outputs[0].parent}")
    cleaner, counts = Cleaner(src_lang, tgt_lang, bounds), Counter()
    partial = [path.with_name(path.name + ".partial") for path in [*outputs, removed_path]]
    handles = [open(path, "w", encoding="utf-8") for path in partial]
    try:
        *kept, removed = handles
        for number, (source, target) in enumerate(iter_parallel(corpus, src_lang, tgt_lang), 1):
            counts["read"] += 1
            verdict = cleaner.verdict(source, target)
            if verdict is None:
                counts["kept"] += 1
                if tsv:
                    kept[0].write(f"{source}\t{target}\n")
                else:
                    kept[0].write(source + "\n")
                    kept[1].write(target + "\n")
            else:
                counts[verdict] += 1
                removed.write(f"{verdict}\t{number}\t{_one_line(source)}\t{_one_line(target)}\n")
    except BaseException:
        for handle, path in zip(handles, partial):
            handle.close()
            path.unlink(missing_ok=True)
        raise
    for handle, path, final in zip(handles, partial, [*outputs, removed_path]):
        handle.close()
        os.replace(path, final)
    return counts


def _one_line(text: str) -> str:
    """A side as one field of the removed-pairs file: its tabs shown as spaces."""
    return text.replace("\t", " ")


def report(counts: Counter) -> str:
    removed = [f"{name} {counts[name]}" for name in FILTERS if counts[name]]
    return (f"read {counts['read']} pairs, kept {counts['kept']}; removed "
            f"{counts['read'] - counts['kept']}" + (f": {', '.join(removed)}" if removed else ""))
