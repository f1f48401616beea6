"""One measurement per fresh process, so threads, allocator and peak RSS start clean.

A benchmark calls itself with a hidden ``--one ...`` mode: the child runs
``print_measurement(measure, ...)`` and the parent reads the result back with
``measure_in_child(command)``. A setting the machine cannot run (bf16 on a CPU
without it) comes back as ``{"error": message}`` so the table goes on; any other
failure stops the benchmark with the child's own messages.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from attnmt.errors import UserError


def print_measurement(measure: Callable[..., dict], *arguments) -> None:
    """Child side: print ``measure(*arguments)`` as one JSON line, or the user error."""
    try:
        result = measure(*arguments)
    except UserError as error:
        result = {"error": str(error)}
    print(json.dumps(result))


def measure_in_child(command: list[str]) -> dict:
    """Parent side: run ``command`` and return the JSON object it printed last."""
    completed = subprocess.run(command, capture_output=True, text=True)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode or not lines:
        sys.exit(f"measurement failed: {' '.join(command)}\n{completed.stderr.strip()}")
    return json.loads(lines[-1])
