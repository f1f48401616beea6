"""The documents as a newcomer reads them: links that resolve, commands the parser accepts,
figures written once, and user docs short enough to finish."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from attnmt.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
RECORDS = sorted((ROOT / "records").glob("*.md"))
MODEL_CARDS = sorted((ROOT / "models").glob("*/README.md"))
USER_DOCS_LIMIT = 150_000

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
GENERATED = re.compile(r"<!-- results: .*?<!-- end results -->", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
# A figure of a results table: BLEU, chrF and their kin have two decimals and two digits.
FIGURE = re.compile(r"(?<![\d.])\d{2}\.\d{2}(?![\d])")
SHELL = {"sh", "bash", "shell", "console"}


def without_code(text: str) -> str:
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercased, punctuation but '-' and '_' dropped,
    spaces as hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in HEADING.findall(without_code(path.read_text(encoding="utf-8"))):
        slug = anchor(heading)
        result.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return result


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(without_code(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target} (no such heading in {linked.name})")
        if path.is_relative_to(ROOT) and not linked.is_relative_to(ROOT):
            broken.append(f"{target} (outside the repository)")
    return broken


@pytest.mark.parametrize("path", USER_DOCS + RECORDS + MODEL_CARDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title, with `code`\n\n[ok](#a-title-with-code) [gone](missing.md) [bad](#nope)\n")
    assert broken_links(page) == ["missing.md (no such file)", "#nope (no such heading in page.md)"]


CONTROL = {"|", "||", "&&", ";", "&"}
REDIRECTION = {"<", ">", ">>", "2>", "&>"}
UNREADABLE = "(unreadable)"


def shell_commands(text: str) -> list[list[str]]:
    """The words of each command of the document's shell blocks (continuations joined,
    comments, pipes and redirections taken out); a line that shlex cannot read (a quote
    spanning lines) is kept whole when it runs attnmt, so that the check reports it."""
    commands = []
    for language, body in FENCE.findall(text):
        if language not in SHELL:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                words = list(lexer)
            except ValueError:
                commands.append([UNREADABLE, line]) if re.search(r"(^|[\s/])attnmt\s", line) else None
                continue
            command, skip = [], False
            for word in words + [";"]:
                if word in CONTROL:
                    commands.append(command) if command else None
                    command = []
                elif word in REDIRECTION:
                    skip = True
                elif skip:
                    skip = False
                else:
                    command.append(word)
    return commands


def attnmt_problems(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What in one `attnmt ...` command its parser does not know: the subcommand or a flag."""
    if words[0] == UNREADABLE:
        return [f"{words[1]!r}: a shell line the check cannot read"]
    while words and re.fullmatch(r"\w+=.*", words[0]):        # VARIABLE=value attnmt ...
        words = words[1:]
    if not words or not words[0].endswith("attnmt"):
        return []
    shown = " ".join(words)
    words = [word.strip("[]") for word in words[1:]]
    subcommands = next(action for action in parser._actions
                       if isinstance(action, argparse._SubParsersAction)).choices
    if not words or words[0] in ("-h", "--help", "--version"):
        return []
    if words[0] not in subcommands:
        return [f"{shown!r}: no command {words[0]!r}"]
    options = subcommands[words[0]]._option_string_actions
    return [f"{shown!r}: attnmt {words[0]} has no option {flag}"
            for flag in (word.split("=", 1)[0] for word in words[1:])
            if flag.startswith("-") and not re.fullmatch(r"-\d.*", flag) and flag not in options]


@pytest.mark.parametrize("path", USER_DOCS + RECORDS + MODEL_CARDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_is_one_the_parser_knows(path):
    parser = build_parser()
    problems = [problem for command in shell_commands(path.read_text(encoding="utf-8"))
                for problem in attnmt_problems(command, parser)]
    assert problems == []


def test_the_command_check_can_fail():
    parser = build_parser()
    text = ("```sh\nattnmt translate de-en --beam 5 < in.de > out.en   # fine\n"
            "attnmt translat de-en\nX=1 attnmt evaluate RUN \\\n    --no-such-flag 1\n"
            "attnmt translate 'open quote\n```\n")
    problems = [problem for command in shell_commands(text) for problem in attnmt_problems(command, parser)]
    assert len(problems) == 3
    assert "no command 'translat'" in problems[0] and "has no option --no-such-flag" in problems[1]
    assert "cannot read" in problems[2]


def generated_figures(paths: list[Path]) -> set[str]:
    return {figure for path in paths
            for block in GENERATED.findall(path.read_text(encoding="utf-8"))
            for figure in FIGURE.findall(block)}


def restated(path: Path, figures: set[str]) -> list[str]:
    text = GENERATED.sub("", path.read_text(encoding="utf-8"))
    return sorted({figure for figure in FIGURE.findall(text) if figure in figures})


def test_no_user_doc_restates_a_generated_figure():
    """A figure lives in its record and shows through a generated table; prose that repeats
    it would drift when the record changes."""
    figures = generated_figures(USER_DOCS)
    problems = {str(path.relative_to(ROOT)): found for path in USER_DOCS
                if (found := restated(path, figures))}
    assert problems == {}


def test_the_restatement_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- results: a | b -->\n| 41.52 | 7.5 |\n<!-- end results -->\n"
                    "It scores 41.52, and 0.41 of spread.\n")
    assert restated(page, generated_figures([page])) == ["41.52"]


def test_user_docs_fit_their_budget():
    sizes = {path.name: len(path.read_text(encoding="utf-8")) for path in USER_DOCS}
    assert sum(sizes.values()) <= USER_DOCS_LIMIT, sorted(sizes.items(), key=lambda item: -item[1])
    assert sizes["README.md"] <= 10_000
