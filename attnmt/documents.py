"""Documents in, documents out: text of several sentences and paragraphs, and HTML.

A model translates one sentence at a time. :func:`split_sentences` cuts a text into its
sentences with Koehn and Schroeder's rules (the splitter of Moses, per language, from
the ``sentence-splitter`` package) and keeps what lies between them (spaces, line
breaks, blank lines), so that :func:`join_sentences` puts the translations back in the
same layout. :func:`html_text_nodes` and :func:`replace_text_nodes` do the same for the
text of an HTML document (parsed by Beautiful Soup), leaving its tags, attributes,
comments and the contents of ``<script>``, ``<style>``, ``<code>`` and ``<pre>`` alone.
"""
from __future__ import annotations

import functools
import re

from bs4 import BeautifulSoup, NavigableString
from bs4.dammit import EntitySubstitution
from bs4.element import PreformattedString
from bs4.formatter import HTMLFormatter
from sentence_splitter import SentenceSplitter, SentenceSplitterException

LEFT_ALONE = frozenset({"script", "style", "code", "pre", "textarea", "template"})


@functools.lru_cache(maxsize=None)
def _splitter(lang: str) -> SentenceSplitter:
    """The splitter of ``lang``; English rules for a language the package has no list of
    abbreviations for (it then splits after every full stop before a capital)."""
    try:
        return SentenceSplitter(language=lang)
    except SentenceSplitterException:
        return SentenceSplitter(language="en")


def _spans(line: str, sentences: list[str]) -> list[tuple[int, int]]:
    """Where each sentence lies in ``line``. The splitter returns the sentences with their
    runs of spaces collapsed, so each is found by its non-space characters, in order."""
    spans, position = [], 0
    for sentence in sentences:
        wanted = len(re.sub(r"\s", "", sentence))
        while position < len(line) and line[position].isspace():
            position += 1
        start = position
        while wanted and position < len(line):
            wanted -= not line[position].isspace()
            position += 1
        spans.append((start, position))
    return spans


def split_sentences(text: str, lang: str) -> tuple[list[str], list[str]]:
    """``(sentences, gaps)`` such that ``gaps[0] + sentences[0] + gaps[1] + ... +
    sentences[-1] + gaps[-1] == text``: a gap holds the whitespace and line breaks between
    two sentences; a line never joins the next (a paragraph's line breaks are kept)."""
    sentences, gaps, start = [], [], 0
    for line in re.finditer(r"[^\n]+", text):
        found = [s for s in _splitter(lang).split(line.group()) if s.strip()]
        for begin, end in _spans(line.group(), found):
            gaps.append(text[start:line.start() + begin])
            sentences.append(text[line.start() + begin:line.start() + end])
            start = line.start() + end
    gaps.append(text[start:])
    return sentences, gaps


def join_sentences(translations: list[str], gaps: list[str]) -> str:
    """The inverse of :func:`split_sentences`, with each sentence replaced by its translation."""
    assert len(gaps) == len(translations) + 1
    return "".join(gap + sentence for gap, sentence in zip(gaps, translations)) + gaps[-1]


class _AsWritten(HTMLFormatter):
    """Beautiful Soup's minimal escaping (``&``, ``<``, ``>``), void elements written as
    HTML writes them (``<br>``), attributes in the document's order (not sorted)."""

    def __init__(self):
        super().__init__(entity_substitution=EntitySubstitution.substitute_xml,
                         void_element_close_prefix="")

    def attributes(self, tag):
        return list(tag.attrs.items())


def parse_html(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


def html_text_nodes(document: BeautifulSoup) -> list[NavigableString]:
    """The text nodes of ``document`` to translate: not comments, declarations or CDATA, not
    inside a tag whose content is code or data (:data:`LEFT_ALONE`), not blank."""
    return [node for node in document.find_all(string=True)
            if not isinstance(node, PreformattedString) and node.strip()
            and not any(parent.name in LEFT_ALONE for parent in node.parents)]


def replace_text_nodes(document: BeautifulSoup, nodes: list[NavigableString],
                       texts: list[str]) -> str:
    """The document with each node's text replaced, serialised (``&``, ``<`` and ``>`` in
    text escaped again; other character references come back as the characters)."""
    for node, text in zip(nodes, texts, strict=True):
        node.replace_with(NavigableString(text))
    return document.decode(formatter=_AsWritten())
