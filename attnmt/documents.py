"""Documents in, documents out: text of several sentences and paragraphs, and HTML.

A model translates one sentence at a time. :func:`split_sentences` cuts a text into its
sentences with Koehn and Schroeder's rules (the splitter of Moses, per language, from
the ``sentence-splitter`` package) and keeps what lies between them (spaces, line
breaks, blank lines), so that :func:`join_sentences` puts the translations back in the
same layout. :func:`parse_html` finds the text of an HTML document to translate (Python's
HTML parser, each text run located in the source) and :meth:`HtmlDocument.rebuild` writes
the translations into the source in place, so everything else (tags, attributes,
comments, declarations, the contents of ``<script>``, ``<style>``, ``<code>``, ``<pre>``,
``<textarea>`` and ``<template>``) comes back byte for byte.

Both take time linear in the text's length: the splitter's rules look at each word's
first and last characters, and a word is handed to it shortened to those (the splitter
is quadratic in a word's length); the HTML parser reads each construct once, and a
document that ends inside a tag, comment or declaration (where Python's parser would go
back over the rest once per ``<``) is refused as :class:`MalformedHtml`.
"""
from __future__ import annotations

import collections
import functools
import html
import html.parser
import re
from dataclasses import dataclass

from sentence_splitter import SentenceSplitter, SentenceSplitterException

LEFT_ALONE = frozenset({"script", "style", "code", "pre", "textarea", "template"})
WORD_END = 24      # characters of a word's start and end the splitter sees (its longest
                   # non-breaking prefix has 11; its rules read no further into a word)


@functools.lru_cache(maxsize=None)
def _splitter(lang: str) -> SentenceSplitter:
    """The splitter of ``lang``; English rules for a language the package has no list of
    abbreviations for (it then splits after every full stop before a capital)."""
    try:
        return SentenceSplitter(language=lang)
    except SentenceSplitterException:
        return SentenceSplitter(language="en")


def _as_seen_by_the_splitter(word: str) -> str:
    """``word`` (no spaces) as the splitter is given it: whitespace that is not a space
    made visible (the splitter would break or strip there), and a long word cut to its
    first and last :data:`WORD_END` characters around a character no rule matches."""
    word = re.sub(r"\s", "\x7f", word)
    if len(word) > 2 * WORD_END + 1:
        word = word[:WORD_END] + "\x7f" + word[-WORD_END:]
    return word


def _split_line(line: str, lang: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each sentence of ``line`` (no line breaks): the splitter
    breaks only between words (runs without spaces), so each of its sentences is a run of
    whole words, found by counting them."""
    words = [match.span() for match in re.finditer(r"[^ ]+", line)]
    if not words:
        return []
    shown = " ".join(_as_seen_by_the_splitter(line[start:end]) for start, end in words)
    spans, first = [], 0
    for sentence in _splitter(lang).split(shown):
        count = len(sentence.split(" "))
        spans.append((words[first][0], words[first + count - 1][1]))
        first += count
    assert first == len(words), "the splitter lost or invented a word"
    return spans


def split_sentences(text: str, lang: str) -> tuple[list[str], list[str]]:
    """``(sentences, gaps)`` such that ``gaps[0] + sentences[0] + gaps[1] + ... +
    sentences[-1] + gaps[-1] == text``: a gap holds the whitespace and line breaks between
    two sentences; a line never joins the next (a paragraph's line breaks are kept)."""
    sentences, gaps, start = [], [], 0
    for line in re.finditer(r"[^\n]+", text):
        for begin, end in _split_line(line.group(), lang):
            if text[line.start() + begin:line.start() + end].strip():
                gaps.append(text[start:line.start() + begin])
                sentences.append(text[line.start() + begin:line.start() + end])
                start = line.start() + end
    gaps.append(text[start:])
    return sentences, gaps


def join_sentences(translations: list[str], gaps: list[str]) -> str:
    """The inverse of :func:`split_sentences`, with each sentence replaced by its translation."""
    assert len(gaps) == len(translations) + 1
    return "".join(gap + sentence for gap, sentence in zip(gaps, translations)) + gaps[-1]


class MalformedHtml(ValueError):
    """A document this module will not rebuild, with the reason."""


@dataclass(frozen=True)
class HtmlDocument:
    """An HTML document and the runs of its text to translate: ``spans[i]`` is where the
    ``i``-th run lies in ``source`` and ``texts[i]`` its text, character references read."""
    source: str
    spans: list[tuple[int, int]]
    texts: list[str]

    def rebuild(self, translations: list[str]) -> str:
        """The source with each run replaced by its translation (``&``, ``<`` and ``>``
        escaped); every other character as it was."""
        pieces, position = [], 0
        for (start, end), translation in zip(self.spans, translations, strict=True):
            pieces += [self.source[position:start], html.escape(translation, quote=False)]
            position = end
        pieces.append(self.source[position:])
        return "".join(pieces)


class _TextFinder(html.parser.HTMLParser):
    """Python's HTML parser, noting where each run of text outside :data:`LEFT_ALONE`
    elements starts and ends in the source (the start of the next construct)."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=True)
        self.source = source
        self.line_starts = [0] + [match.end() for match in re.finditer("\n", source)]
        self.open_left_alone: collections.Counter = collections.Counter()
        self.spans: list[tuple[int, int]] = []
        self.run_start: int | None = None          # the text run being read, if any

    def here(self) -> int:
        line, column = self.getpos()
        return self.line_starts[line - 1] + column

    def end_run(self, end: int) -> None:
        if self.run_start is not None and self.source[self.run_start:end].strip():
            self.spans.append((self.run_start, end))
        self.run_start = None

    def handle_data(self, data):
        if self.cdata_elem == "script" and "<!--" in data and "<script" in data.lower():
            raise MalformedHtml("a <script> whose content opens a comment and another "
                                "<script> (browsers end it elsewhere than this parser)")
        if self.run_start is None and not any(self.open_left_alone.values()):
            self.run_start = self.here()

    def handle_starttag(self, tag, attrs):
        self.end_run(self.here())
        if tag in LEFT_ALONE:
            self.open_left_alone[tag] += 1

    def handle_endtag(self, tag):
        self.end_run(self.here())
        if self.open_left_alone[tag]:
            self.open_left_alone[tag] -= 1

    def handle_startendtag(self, tag, attrs):
        self.end_run(self.here())

    def handle_comment(self, data):
        self.end_run(self.here())

    handle_decl = handle_pi = unknown_decl = handle_comment


def parse_html(source: str) -> HtmlDocument:
    """The runs of text of ``source`` to translate (not blank, not in :data:`LEFT_ALONE`
    elements); :class:`MalformedHtml` for a document that ends inside a tag, comment or
    declaration, or that Python's parser rejects."""
    finder = _TextFinder(source)
    try:
        finder.feed(source)
        rest = finder.rawdata
        if rest.startswith("<") and not finder.cdata_elem:
            raise MalformedHtml(f"the tag, comment or declaration at character "
                                f"{len(source) - len(rest)} is never closed with '>'")
        if not finder.cdata_elem:                   # text held back for a character reference
            finder.close()
            rest = ""
    except AssertionError as error:                 # how Python's parser rejects markup
        raise MalformedHtml(str(error)) from None
    finder.end_run(len(source) - len(rest))
    return HtmlDocument(source, finder.spans,
                        [html.unescape(source[start:end]) for start, end in finder.spans])
