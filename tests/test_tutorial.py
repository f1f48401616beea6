"""docs/tutorial.ipynb and its Korean twin docs/tutorial.ko.ipynb run from a clean kernel,
their committed outputs are the current code's, their code cells are the same but for the
comments and the texts they print (Korean in the Korean notebook), and the Korean glossary has the notes' terms.
The claims the prose makes about outputs are asserted inside the notebooks' own cells.

Render the outputs after changing the notebooks or the code they show:

    python tests/test_tutorial.py --render

Cells tagged ``trained`` show results of training (they vary with the machine) and are
only required to run; every other cell's text output must equal the committed one
(numbers to 2e-3, so another CPU's last bits do not matter). Their 5-minute target is
measured by ``benchmarks/tutorial_time.py``, not here: a test's clock would measure the
machine CI happens to get.
"""

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the dev extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the dev extra is not installed")

DOCS = Path(__file__).resolve().parents[1] / "docs"
NOTEBOOKS = [DOCS / "tutorial.ipynb", DOCS / "tutorial.ko.ipynb"]
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
HANGUL = re.compile("[\uac00-\ud7a3]")
# The terms of the five source notes, as the Korean tutorial writes them; its glossary
# (the last cell) must give each one.
NOTES_TERMS = ["sequence-to-sequence", "encoder-decoder", "조건부 언어 모델", "context vector",
               "병목", "vanishing gradient", "linear interaction distance", "병렬화",
               "encoder hidden state", "decoder hidden state", "attention score",
               "attention distribution", "attention output", "alignment model", "soft alignment",
               "Query, Key, Value", "dot-product attention", "multiplicative attention", "bilinear",
               "additive attention", "multi-layer perceptron", "scaled dot-product attention",
               "Self-Attention", "Multi-Head Attention", "Masked Multi-Head Attention",
               "Feed Forward Network", "cell state", "forget gate", "잔차 연결", "층 정규화", "positional encoding",
               "greedy decoding", "beam search", "beam size"]


CHECKED = "\u2713"                       # ✓ after a claim that an assert beside it checks
INLINE_CODE = re.compile(r"`[^`]*`")


def asserts(source: str) -> list[ast.Assert]:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith("%")]
    return [node for node in ast.walk(ast.parse("\n".join(lines))) if isinstance(node, ast.Assert)]


def reads_a_computed_value(check: ast.Assert) -> bool:
    """An assert that names no variable compares constants: it cannot fail for a wrong result."""
    return any(isinstance(node, ast.Name) for node in ast.walk(check.test))


def claims(markdown: str) -> int:
    return INLINE_CODE.sub("", markdown).count(CHECKED)


def claims_without_checks(notebook) -> list[str]:
    """Markdown cells with more claims marked checked than asserts in the code cells beside them."""
    cells, problems = notebook.cells, []
    for index, cell in enumerate(cells):
        if cell.cell_type != "markdown" or not claims(cell.source):
            continue
        beside = [cells[i] for i in (index - 1, index + 1) if 0 <= i < len(cells)
                  and cells[i].cell_type == "code"]
        checks = sum(len(asserts(code.source)) for code in beside)
        if claims(cell.source) > checks:
            problems.append(f"cell {index}: {claims(cell.source)} claims marked checked, {checks} asserts beside")
    return problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.name)
def test_every_claim_marked_checked_has_an_assert_on_computed_values(notebook):
    book = nbformat.read(notebook, as_version=4)
    constant = [f"cell {index}: assert {ast.unparse(check.test)}" for index, cell in enumerate(book.cells)
                if cell.cell_type == "code" for check in asserts(cell.source)
                if not reads_a_computed_value(check)]
    assert constant == []
    assert claims_without_checks(book) == []
    marked = sum(claims(cell.source) for cell in book.cells if cell.cell_type == "markdown")
    assert marked >= 9, f"{notebook.name} marks {marked} claims as checked"


def test_the_claim_checks_can_fail():
    book = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Two claims \u2713 and \u2713, and `\u2713` is not one."),
        nbformat.v4.new_code_cell("x = 2\nassert x > 1\nassert 1e-12 < 1e-4")])
    assert claims_without_checks(book) == []
    assert [reads_a_computed_value(check) for check in asserts(book.cells[1].source)] == [True, False]
    book.cells[1].source = "x = 2\nassert x > 1"
    assert claims_without_checks(book) == ["cell 0: 2 claims marked checked, 1 asserts beside"]


def execute(notebook):
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(DOCS)}})
    client.execute()
    return notebook


def is_printed(output: dict) -> bool:
    return output.get("output_type") == "stream" and output.get("name") == "stdout"


def text_outputs(cell) -> list[str]:
    """The cell's printed and displayed texts; printed text that the kernel happened to send
    in several pieces (it may flush ``print``'s newline on its own) counts as one."""
    texts, previous = [], {}
    for output in cell.get("outputs", []):
        if is_printed(output) and is_printed(previous):
            texts[-1] += output["text"]
        elif is_printed(output):
            texts.append(output["text"])
        elif output.get("output_type") in ("execute_result", "display_data"):
            if "image/png" not in output.get("data", {}):
                texts.append(output["data"].get("text/plain", ""))
        previous = output
    return texts


def same_text(ours: str, committed: str) -> bool:
    if NUMBER.sub("#", ours) != NUMBER.sub("#", committed):
        return False
    pairs = zip(NUMBER.findall(ours), NUMBER.findall(committed))
    return all(abs(float(a) - float(b)) <= 2e-3 for a, b in pairs)


def test_printed_text_sent_in_pieces_reads_as_one():
    stream = {"output_type": "stream", "name": "stdout"}
    shown = {"output_type": "execute_result", "data": {"text/plain": "3"}}
    cell = {"outputs": [{**stream, "text": "a"}, {**stream, "text": "\n"}, shown,
                        {**stream, "text": "b\n"}]}
    assert text_outputs(cell) == ["a\n", "3", "b\n"]


def code_and_comments(source: str) -> tuple[list[tuple[int, str]], list[str]]:
    """A code cell's tokens without its comments, string literals as one placeholder (the
    Korean notebook prints and asserts in Korean), and its comments (IPython's ``%`` lines
    are read as comments' neighbours: they are kept as code)."""
    lines = [line if not line.lstrip().startswith("%") else f"pass  # {line}" for line in
             source.splitlines()]
    tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    code = [(token.type, "<text>" if token.type in strings else token.string) for token in tokens
            if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]
    comments = [token.string for token in tokens if token.type == tokenize.COMMENT
                and not token.string.lstrip("# ").startswith("%")]
    return code, comments


def test_the_korean_tutorial_has_the_same_code_and_korean_prose_and_comments():
    english, korean = (nbformat.read(path, as_version=4) for path in NOTEBOOKS)
    assert [c.cell_type for c in english.cells] == [c.cell_type for c in korean.cells]
    for ours, theirs in zip(english.cells, korean.cells):
        if ours.cell_type == "code":
            (our_code, _), (their_code, comments) = (code_and_comments(cell.source)
                                                     for cell in (ours, theirs))
            assert our_code == their_code
            assert ours.metadata.get("tags") == theirs.metadata.get("tags")
            english_comments = [comment for comment in comments if not HANGUL.search(comment)]
            assert not english_comments, f"comments left in English: {english_comments}"
        else:
            assert HANGUL.search(theirs.source), theirs.source[:80]


def test_the_korean_glossary_gives_every_term_of_the_notes():
    glossary = nbformat.read(NOTEBOOKS[1], as_version=4).cells[-1].source
    assert glossary.startswith("## 용어집")
    first_column = [row.split("|")[1] for row in glossary.splitlines() if row.startswith("| ")]
    missing = [term for term in NOTES_TERMS if not any(term in cell for cell in first_column)]
    assert not missing, f"the glossary lacks {missing}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.name)
def test_tutorial_runs_and_its_outputs_are_current(notebook):
    committed = nbformat.read(notebook, as_version=4)
    fresh = execute(nbformat.read(notebook, as_version=4))
    errors = [output for cell in fresh.cells for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert not errors, errors
    for number, (ours, theirs) in enumerate(zip(fresh.cells, committed.cells)):
        if ours.cell_type != "code" or "trained" in ours.metadata.get("tags", []):
            continue
        ours_text, theirs_text = text_outputs(ours), text_outputs(theirs)
        assert len(ours_text) == len(theirs_text) and all(
            same_text(a, b) for a, b in zip(ours_text, theirs_text)), (
            f"cell {number} prints something else than the committed notebook; "
            f"render it again: python tests/test_tutorial.py --render\n{ours_text}\n{theirs_text}")


if __name__ == "__main__" and sys.argv[1:] == ["--render"]:
    for path in NOTEBOOKS:
        nbformat.write(execute(nbformat.read(path, as_version=4)), path)
        print(f"rendered {path}")
