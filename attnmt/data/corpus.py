"""Parallel corpora: plain-text file pairs, TSV files, and the Multi30k task-1 files.

Every reader returns a :class:`ParallelCorpus` of raw strings. Problems a user can
cause (a missing file, line counts that differ, bad UTF-8) raise :class:`UserError`
with one line naming the file; filtering is reported, never silent.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from attnmt.errors import UserError


@dataclass
class ParallelCorpus:
    source: list[str]
    target: list[str]
    name: str

    def __len__(self) -> int:
        return len(self.source)


def iter_lines(path: Path):
    """Lines of a UTF-8 text file (``.gz`` decompressed), without line ends, one at a time."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    yield raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as error:
                    raise UserError(f"{path}: line {number} is not valid UTF-8 "
                                    f"(byte {error.start}: {raw[error.start:error.start + 1]!r})"
                                    ) from None
    except (OSError, EOFError) as error:
        raise UserError(f"cannot read {path}: {error}") from None


def read_lines(path: Path) -> list[str]:
    return list(iter_lines(path))


def find_language_file(prefix: str | Path, lang: str) -> Path:
    """``corpus/train`` + ``de`` -> ``corpus/train.de`` or ``corpus/train.de.gz``."""
    plain = Path(f"{prefix}.{lang}")
    for candidate in (plain, Path(f"{plain}.gz")):
        if candidate.is_file():
            return candidate
    raise UserError(f"file not found: {plain} (nor {plain}.gz)")


def iter_parallel(prefix: str | Path, src_lang: str, tgt_lang: str):
    """``(source, target)`` pairs streamed from a prefix and two languages, or from a
    ``.tsv``/``.tsv.gz`` file of ``source<TAB>target`` lines; never the whole corpus in memory."""
    if str(prefix).endswith((".tsv", ".tsv.gz")):
        yield from _iter_tsv(Path(prefix))
        return
    source_path = find_language_file(prefix, src_lang)
    target_path = find_language_file(prefix, tgt_lang)
    for pair in itertools.zip_longest(iter_lines(source_path), iter_lines(target_path)):
        if None in pair:                                     # one file ended first: count both
            raise UserError(f"line counts differ: {source_path} has "
                            f"{sum(1 for _ in iter_lines(source_path))} lines, {target_path} has "
                            f"{sum(1 for _ in iter_lines(target_path))}")
        yield pair


def read_parallel(prefix: str | Path, src_lang: str, tgt_lang: str) -> ParallelCorpus:
    """The whole corpus of :func:`iter_parallel` in memory."""
    source, target = [], []
    for source_line, target_line in iter_parallel(prefix, src_lang, tgt_lang):
        source.append(source_line)
        target.append(target_line)
    return ParallelCorpus(source, target, str(prefix))


def _iter_tsv(path: Path):
    for number, line in enumerate(iter_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2:
            raise UserError(f"{path}: line {number} has {len(fields)} tab-separated fields, "
                            "expected 2 (source<TAB>target)")
        yield fields[0], fields[1]


# --- Multi30k -------------------------------------------------------------------------------

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}"
MULTI30K_LANGS = ("cs", "de", "en", "fr")
MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# SHA-256 of the task-1 raw files of the public Multi30k repository (data/task1/raw/).
MULTI30K_SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def multi30k_folder(configured: str) -> Path | None:
    """The first folder holding the Multi30k files: ``data.dir``, ``$ATTNMT_DATA``, the cache."""
    for folder in _multi30k_candidates(configured):
        if (folder / "train.en.gz").is_file() or (folder / "train.en").is_file():
            return folder
    return None


def _multi30k_candidates(configured: str) -> list[Path]:
    candidates = [Path(configured)] if configured else []
    if os.environ.get("ATTNMT_DATA"):
        candidates.append(Path(os.environ["ATTNMT_DATA"]))
    candidates.append(_cache_folder())
    return candidates


def _cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnmt" / "multi30k"


def read_multi30k(split: str, src_lang: str, tgt_lang: str, configured_dir: str) -> ParallelCorpus:
    """One split (``train``, ``valid`` or ``test``) of Multi30k task 1, downloading if absent."""
    for lang in (src_lang, tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise UserError(f"Multi30k has {', '.join(MULTI30K_LANGS)}; got language {lang!r}")
    folder = multi30k_folder(configured_dir) or _download_multi30k(configured_dir)
    corpus = read_parallel(folder / MULTI30K_SPLITS[split], src_lang, tgt_lang)
    corpus.name = f"multi30k/{MULTI30K_SPLITS[split]}"
    return corpus


def _download_multi30k(configured_dir: str) -> Path:
    target = _cache_folder()
    looked = ", ".join(str(folder) for folder in _multi30k_candidates(configured_dir))
    target.mkdir(parents=True, exist_ok=True)
    try:
        for split in MULTI30K_SPLITS.values():
            for lang in MULTI30K_LANGS:
                _download_verified(f"{split}.{lang}.gz", target)
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        raise UserError(f"Multi30k files not found (looked in {looked}) and the download failed "
                        f"({error}); put train/val/test_2016_flickr.{{cs,de,en,fr}}.gz in a folder and "
                        "set data.dir or ATTNMT_DATA to it") from None
    return target


def _download_verified(name: str, folder: Path) -> None:
    destination = folder / name
    if destination.is_file():
        return
    with urllib.request.urlopen(MULTI30K_URL.format(name=name), timeout=30) as response, \
            tempfile.NamedTemporaryFile(dir=folder, delete=False) as temporary:
        shutil.copyfileobj(response, temporary)
    digest = hashlib.sha256(Path(temporary.name).read_bytes()).hexdigest()
    expected = MULTI30K_SHA256[name]
    if digest != expected:
        os.unlink(temporary.name)
        raise UserError(f"downloaded {name} has SHA-256 {digest}, expected {expected}")
    os.replace(temporary.name, destination)
