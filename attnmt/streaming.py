"""Translating files of any size: chunk by chunk, in input order, resumable.

``attnmt translate`` and ``attnmt synthesize`` read their input a chunk of lines at a
time, translate the chunk, append its lines to the output files and push them to the
disk, so memory does not grow with the input and an interrupted run leaves whole chunks
behind. A :class:`ResumeRecord` beside the output says how it is made and how far it
got; run again with ``--resume``, the command checks that the input and the settings
are the same, and continues after the recorded lines; the files end as those of an
uninterrupted run. An output that is the input is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import json
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


RECORD_SUFFIX = ".resume.json"


class ResumeRecord:
    """How an output is being made, so that ``--resume`` continues only the same work.

    Beside the first output, ``OUTPUT.resume.json`` holds the settings that shape the
    output, the input's path and size, how many input lines are done with the SHA-256 of
    those lines as read, and the size of every output file when they were done. It is
    rewritten (atomically) after each chunk is on disk and removed when the work ends.
    Resuming checks all of it before anything is written, then cuts the outputs back to
    the recorded sizes: whatever a kill left after the last chunk goes.
    """

    def __init__(self, outputs: list[Path], source: str, settings: dict):
        self.outputs, self.source, self.settings = [Path(p) for p in outputs], source, settings
        self.path = self.outputs[0].with_name(self.outputs[0].name + RECORD_SUFFIX)
        self.digest, self.lines = hashlib.sha256(), 0

    def start(self, lines: Iterator[str], resume: bool) -> Iterator[str]:
        """The input lines still to translate: all of them, or with ``resume`` those after
        the recorded ones (which must be the same text). A record that does not match this
        input and these settings is refused in one line; without ``resume`` the work is
        recorded anew, from its start."""
        recorded = self._recorded() if resume else None
        if recorded is None:                         # from the start: so it is recorded
            self._write([0] * len(self.outputs))
            return lines
        for number in range(recorded["lines"]):
            line = next(lines, None)
            if line is None:
                raise UserError(f"cannot resume: {self.path} records {recorded['lines']} lines "
                                f"done, but {self.source} has only {number}")
            self._read(line)
        if self.digest.hexdigest() != recorded["sha256"]:
            raise UserError(f"cannot resume: the first {self.lines} lines of {self.source} are not "
                            f"those {self.path} records; translate again without --resume")
        for path, size in zip(self.outputs, recorded["output_bytes"]):
            with open(path, "ab") as handle:
                handle.truncate(size)
        return lines

    def _recorded(self) -> dict | None:
        """The record to continue from, checked; None when there is nothing to continue."""
        if not self.path.is_file():
            if any(path.is_file() and path.stat().st_size for path in self.outputs):
                raise UserError(f"cannot resume: {self.outputs[0]} has no record of how it was "
                                f"made ({self.path}: it was finished, or made by an older "
                                "attnmt); translate again without --resume")
            return None
        try:
            recorded = json.loads(self.path.read_text(encoding="utf-8"))
            settings, lines, sizes = (recorded["settings"], int(recorded["lines"]),
                                      [int(size) for size in recorded["output_bytes"]])
            if not isinstance(settings, dict):
                raise TypeError("settings is not a mapping")
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"cannot resume: {self.path} is not a resume record of attnmt") from None
        changed = [key for key in sorted({*settings, *self.settings})
                   if settings.get(key) != self.settings.get(key)]
        if changed:
            key = changed[0]
            raise UserError(f"cannot resume with other settings: {key} was "
                            f"{settings.get(key)!r}, now {self.settings.get(key)!r}; use the same "
                            "settings, or translate again without --resume")
        if recorded.get("input_bytes") != Path(self.source).stat().st_size:
            raise UserError(f"cannot resume: {self.source} has changed since {self.path} was "
                            "written; translate again without --resume")
        for path, size in zip(self.outputs, sizes):
            if (path.stat().st_size if path.is_file() else 0) < size:
                raise UserError(f"cannot resume: {path} is shorter than {self.path} records; "
                                "translate again without --resume")
        return {**recorded, "lines": lines, "output_bytes": sizes}

    def _read(self, line: str) -> None:
        self.digest.update(line.encode("utf-8") + b"\n")
        self.lines += 1

    def advance(self, lines: list[str]) -> None:
        """Record ``lines`` (the next input lines) as done; call once their output is on disk."""
        for line in lines:
            self._read(line)
        self._write([path.stat().st_size for path in self.outputs])

    def _write(self, output_bytes: list[int]) -> None:
        record = {"settings": self.settings, "input": self.source,
                  "input_bytes": Path(self.source).stat().st_size, "lines": self.lines,
                  "sha256": self.digest.hexdigest(), "output_bytes": output_bytes}
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(record, handle, ensure_ascii=False, indent=1)
            sync(handle)
        os.replace(temporary, self.path)

    def finish(self) -> None:
        """The work is done: nothing is left to resume."""
        self.path.unlink(missing_ok=True)


def refuse_overwriting(source: str | None, outputs: list[Path]) -> None:
    """One line, before anything is opened for writing, when an output is the input."""
    for output in outputs:
        if source is not None and same_file(Path(source), Path(output)):
            raise UserError(f"the output {output} is the input {source}: writing it would destroy "
                            "the input; choose another output")


def same_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file (through links too)."""
    if first.exists() and second.exists():
        return os.path.samefile(first, second)
    return first.resolve() == second.resolve()


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
