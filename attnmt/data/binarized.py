"""Corpora larger than memory: ``attnmt prepare`` writes token ids to flat binary files
that training reads through memory maps.

``RUN/data/train.src.bin`` and ``train.tgt.bin`` hold the token ids of all kept pairs
back to back (uint16, or uint32 for vocabularies over 65,536); ``train.src.idx.npy`` and
``train.tgt.idx.npy`` hold the offsets (pair ``i`` is ``bin[idx[i]:idx[i+1]]``);
``train.json`` says what was kept. Preparing streams the corpus in chunks, so memory
does not grow with its size; files are written under temporary names and renamed at
the end, so an interrupted prepare is simply run again.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from attnmt.config import Config
from attnmt.data.tensors import Batch, make_batch
from attnmt.data.corpus import iter_parallel
from attnmt.data.datasets import drop_reason, load_split
from attnmt.data.tokenizers import (TOKENIZER_FILE, load_tokenizers, save_tokenizers,
                                    train_tokenizers)
from attnmt.errors import UserError

DATA_FOLDER = "data"
TOKENIZER_SAMPLE = 500_000          # pairs the tokenizers learn from (the corpus start)


def iter_training_pairs(config: Config):
    """``(source, target)`` training pairs, sources tagged, streamed for file corpora."""
    data = config.data
    if data.synthetic:
        raise UserError("data.synthetic mixes corpora in memory; train without 'attnmt prepare'")
    if data.dataset == "files":
        pairs = [(lang, data.tgt_lang) for lang in (data.src_lang, *data.extra_src_langs)]
        pairs += [(data.src_lang, lang) for lang in data.extra_tgt_langs]
        return itertools.chain.from_iterable(_tagged_pairs(data, *pair) for pair in pairs)
    corpus = load_split(data, "train")
    return zip(corpus.source, corpus.target)


def _tagged_pairs(data, src_lang: str, tgt_lang: str):
    tag = data.target_tag(tgt_lang)
    for source, target in iter_parallel(data.train, src_lang, tgt_lang):
        yield (f"{tag} {source}" if tag else source), target


def prepare(config: Config, run: Path, chunk_pairs: int = 20_000) -> dict:
    """Tokenizers (trained on the first pairs if absent) and the binarised training split."""
    folder = run / DATA_FOLDER
    if (folder / "train.json").is_file():
        return json.loads((folder / "train.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    if not (run / TOKENIZER_FILE).is_file():
        sample = list(itertools.islice(iter_training_pairs(config), TOKENIZER_SAMPLE))
        save_tokenizers(run, *train_tokenizers(config.data, [s for s, _ in sample],
                                               [t for _, t in sample]))
    source_tokenizer, target_tokenizer = load_tokenizers(run)
    dtype = np.uint16 if max(source_tokenizer.vocab_size, target_tokenizer.vocab_size) <= 65536 \
        else np.uint32
    start, counts = time.perf_counter(), {"read": 0, "kept": 0, "empty": 0, "long": 0}
    writers = {side: _SideWriter(folder / f"train.{side}", dtype) for side in ("src", "tgt")}
    pairs = iter_training_pairs(config)
    with tqdm(unit=" pairs", unit_scale=True, file=sys.stderr, disable=None) as bar:
        while chunk := list(itertools.islice(pairs, chunk_pairs)):
            sources = source_tokenizer.encode_tagged_batch([s for s, _ in chunk])
            targets = target_tokenizer.encode_batch([t for _, t in chunk])
            for source, target in zip(sources, targets):
                reason = drop_reason(source, target, config.data.max_len)
                counts[reason or "kept"] += 1
                if reason is None:
                    writers["src"].add(source)
                    writers["tgt"].add(target)
            counts["read"] += len(chunk)
            bar.update(len(chunk))
    if not counts["kept"]:
        raise UserError(f"no training pairs left after filtering ({counts['empty']} empty, "
                        f"{counts['long']} longer than data.max_len={config.data.max_len})")
    for writer in writers.values():
        writer.close()
    seconds = time.perf_counter() - start
    report = {**counts, "dtype": np.dtype(dtype).name, "seconds": round(seconds, 1),
              "pairs_per_s": round(counts["read"] / max(seconds, 1e-9))}
    temporary = folder / ".train.json.tmp"
    temporary.write_text(json.dumps(report, indent=1))
    os.replace(temporary, folder / "train.json")
    return report


class _SideWriter:
    """Appends one side's token ids to ``PREFIX.bin`` and records offsets in ``PREFIX.idx.npy``."""

    def __init__(self, prefix: Path, dtype):
        self.prefix, self.dtype = prefix, dtype
        self.temporary = prefix.with_name(f".{prefix.name}.bin.tmp")
        self.handle = open(self.temporary, "wb")
        self.lengths: list[int] = []

    def add(self, ids: list[int]) -> None:
        self.handle.write(np.asarray(ids, dtype=self.dtype).tobytes())
        self.lengths.append(len(ids))

    def close(self) -> None:
        self.handle.close()
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        index_temporary = self.prefix.with_name(f".{self.prefix.name}.idx.tmp.npy")
        np.save(index_temporary, offsets)
        os.replace(index_temporary, self.prefix.with_name(f"{self.prefix.name}.idx.npy"))
        os.replace(self.temporary, self.prefix.with_name(f"{self.prefix.name}.bin"))


class BinarizedSplit:
    """The prepared training split, read lazily: only the lengths live in memory."""

    def __init__(self, run: Path):
        folder = run / DATA_FOLDER
        description = json.loads((folder / "train.json").read_text())
        self.tokens, offsets = {}, {}
        for side in ("src", "tgt"):
            offsets[side] = np.load(folder / f"train.{side}.idx.npy")
            self.tokens[side] = np.memmap(folder / f"train.{side}.bin", dtype=description["dtype"],
                                          mode="r")
        self.offsets = offsets
        self.src_lengths = np.diff(offsets["src"])
        self.tgt_lengths = np.diff(offsets["tgt"])
        self.report = (f"{DATA_FOLDER}/train: {description['read']} pairs, kept {description['kept']} "
                       f"(dropped {description['empty']} empty, {description['long']} too long)")

    def __len__(self) -> int:
        return len(self.src_lengths)

    def pair(self, index: int) -> tuple[list[int], list[int]]:
        return tuple(self.tokens[side][self.offsets[side][index]:self.offsets[side][index + 1]]
                     .tolist() for side in ("src", "tgt"))

    def batch(self, indices: list[int], pad_multiple: int = 1) -> Batch:
        pairs = [self.pair(i) for i in indices]
        return make_batch([s for s, _ in pairs], [t for _, t in pairs], indices, pad_multiple)


def is_prepared(run: Path) -> bool:
    return (run / DATA_FOLDER / "train.json").is_file()
