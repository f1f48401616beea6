"""Translating files of any size: chunk by chunk, in input order, resumable.

``attnmt translate`` and ``attnmt synthesize`` read their input a chunk of lines at a
time, translate the chunk, append its lines to the output files and flush them, so
memory does not grow with the input and an interrupted run leaves whole chunks behind
(and at most one cut line, which :func:`resume_position` drops). Run again with
``--resume``, the command counts the finished inputs and continues after them; the
files end as those of an uninterrupted run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator

from attnmt.errors import UserError

CHUNK_LINES = 2000


def read_lines(stream, name: str) -> Iterator[str]:
    """The UTF-8 lines of a binary stream without their ends; a line that is not UTF-8
    stops with its number."""
    for number, raw in enumerate(iter(stream.readline, b""), start=1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise UserError(f"{name}: line {number} is not valid UTF-8") from None


def chunks(lines: Iterable[str], size: int = CHUNK_LINES) -> Iterator[tuple[int, list[str]]]:
    """``(index of first line, lines)`` of at most ``size`` lines, so input may be endless."""
    chunk, first = [], 0
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield first, chunk
            first, chunk = first + size, []
    if chunk:
        yield first, chunk


def skip(lines: Iterator[str], count: int) -> Iterator[str]:
    """``lines`` after the first ``count``; an input shorter than that is refused."""
    for number in range(count):
        if next(lines, None) is None:
            raise UserError(f"the output already holds {count} translated lines, but the input has "
                            f"only {number}: is it the same input?")
    return lines


def resume_position(path: Path, inputs_of=None) -> int:
    """How many inputs ``path`` holds finished, after cutting what follows them.

    Without ``inputs_of``, a finished input is one complete line. With n-best output,
    ``inputs_of(line)`` gives the input index a line belongs to, and the lines of the
    last index are cut too, since they may be incomplete. A missing file holds none.
    """
    if not path.is_file():
        return 0
    complete, last_index, keep_bytes, index_start = 0, None, 0, 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break                                   # cut inside a line
            if inputs_of is not None:
                index = inputs_of(raw)
                if index != last_index:
                    last_index, index_start = index, keep_bytes
            keep_bytes += len(raw)
            complete += 1
    if inputs_of is not None:
        keep_bytes = index_start if last_index is not None else 0
        complete = last_index or 0
    with open(path, "r+b") as handle:
        handle.truncate(keep_bytes)
    return complete


def keep_lines(path: Path, count: int) -> None:
    """Cut ``path`` after its first ``count`` lines (the files of a pair end at the same pair)."""
    if not path.is_file():
        return
    kept = 0
    with open(path, "rb") as handle:
        for _ in range(count):
            kept += len(handle.readline())
    with open(path, "r+b") as handle:
        handle.truncate(kept)


def n_best_index(raw: bytes) -> int:
    """The input index that starts an n-best line, ``index ||| hypothesis ||| score``."""
    head = raw.split(b" ||| ", 1)[0]
    if not head.isdigit():
        raise UserError(f"cannot resume: {raw[:60]!r} is not a line of n-best output")
    return int(head)


def progress_bar(total: int | None, enabled: bool | None, description: str):
    """A tqdm bar on standard error: shown with ``enabled``, or when it is a terminal with None."""
    from tqdm import tqdm

    show = enabled if enabled is not None else sys.stderr.isatty()
    return tqdm(total=total, unit=" lines", unit_scale=True, desc=description, file=sys.stderr,
                disable=not show, dynamic_ncols=True)


def count_lines(path: str | Path) -> int:
    """Lines of a text file (``.gz`` decompressed), for the progress bar's total."""
    from attnmt.data.corpus import iter_lines

    return sum(1 for _ in iter_lines(Path(path)))


def sync(handle) -> None:
    """Push a file's written lines to the disk, so a crash cannot lose what resume counts."""
    handle.flush()
    os.fsync(handle.fileno())


def translate_chunks(translate: Callable[[list[str]], list], lines: Iterator[str],
                     write: Callable[[int, list[str], list], None], bar,
                     first: int = 0, size: int = CHUNK_LINES) -> int:
    """Translate ``lines`` chunk by chunk, calling ``write(index of first line, lines,
    translations)`` after each; returns the number of lines translated."""
    done = 0
    for start, chunk in chunks(lines, size):
        write(first + start, chunk, translate(chunk))
        bar.update(len(chunk))
        done += len(chunk)
    bar.close()
    return done
