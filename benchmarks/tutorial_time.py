"""How long the tutorials take to run from a clean kernel, against their 5-minute target.

    python benchmarks/tutorial_time.py [NOTEBOOK ...]

Runs each notebook (default: docs/tutorial.ipynb and docs/tutorial.ko.ipynb) one after
the other with nbclient, as tests/test_tutorial.py does, and prints its wall-clock time
from kernel start to the last cell and its slowest cells. Nothing else should run on the
machine meanwhile. Exit status 1 when a notebook fails or takes longer than 5 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import nbclient
import nbformat

DOCS = Path(__file__).resolve().parents[1] / "docs"
TARGET_SECONDS = 300


def cell_seconds(cell) -> float:
    """The kernel's own record of the cell: from its input arriving to its reply."""
    timing = cell.metadata.get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def first_line(cell) -> str:
    return next((line for line in cell.source.splitlines() if line.strip()), "")[:60]


def run(path: Path) -> float:
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    verdict = "within" if seconds < TARGET_SECONDS else "OVER"
    print(f"{path.name}: {seconds:.0f} s ({verdict} the {TARGET_SECONDS} s target)")
    cells = [(cell_seconds(cell), number, cell) for number, cell in enumerate(notebook.cells)
             if cell.cell_type == "code"]
    for taken, number, cell in sorted(cells, key=lambda item: item[0], reverse=True)[:5]:
        print(f"  cell {number:>2}: {taken:6.1f} s  {first_line(cell)}")
    in_cells = sum(taken for taken, _, _ in cells)
    print(f"  all code cells {in_cells:.1f} s, the kernel's start and the rest "
          f"{seconds - in_cells:.1f} s")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        default=[DOCS / "tutorial.ipynb", DOCS / "tutorial.ko.ipynb"])
    args = parser.parse_args()
    missing = [str(path) for path in args.notebooks if not path.is_file()]
    if missing:
        print(f"tutorial_time.py: no notebook {', '.join(missing)}")
        return 1
    try:
        seconds = [run(path) for path in args.notebooks]
    except nbclient.exceptions.CellExecutionError as error:
        print(f"a cell failed\n{error}")
        return 1
    return 1 if max(seconds) >= TARGET_SECONDS else 0


if __name__ == "__main__":
    sys.exit(main())
