"""Tokenizers saved in a run directory: SentencePiece (unigram or BPE), characters, whitespace.

Every tokenizer uses the fixed special ids of :mod:`attnmt.data` (pad 0, bos 1, eos 2,
unk 3) and offers ``encode(text) -> ids``, ``decode(ids) -> text``, ``pieces(text)``
and ``vocab_size``. ``encode`` adds no BOS/EOS; batching does that.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import sentencepiece as spm

from attnmt.config import DataConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from attnmt.errors import UserError

TOKENIZER_FILE = "tokenizer.json"


def content_ids(ids) -> list[int]:
    """Token ids without padding, BOS and EOS."""
    return [i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)]


class SentencePieceTokenizer:
    def __init__(self, model_bytes: bytes):
        self.model_bytes = model_bytes
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        self.vocab_size = self.processor.get_piece_size()

    @classmethod
    def train(cls, texts: list[str], vocab_size: int, model_type: str) -> "SentencePieceTokenizer":
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
            normalization_rule_name="identity", pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            unk_id=UNK_ID, pad_piece=SPECIAL_TOKENS[0], bos_piece=SPECIAL_TOKENS[1],
            eos_piece=SPECIAL_TOKENS[2], unk_piece=SPECIAL_TOKENS[3], input_sentence_size=2_000_000,
            shuffle_input_sentence=True, num_threads=2, minloglevel=2)
        return cls(model.getvalue())

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.processor.encode(texts)

    def sample_batch(self, texts: list[str], alpha: float, nbest: int) -> list[list[int]]:
        """One sampled segmentation per text (subword regularisation): unigram models sample
        from the ``nbest`` best (``-1``: all) with smoothing ``alpha``; BPE models drop
        merges with probability ``alpha`` (BPE-dropout)."""
        return self.processor.encode(texts, enable_sampling=True, alpha=alpha, nbest_size=nbest)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(content_ids(ids))

    def pieces(self, text: str) -> list[str]:
        return self.processor.encode(text, out_type=str)

    def id_to_piece(self, index: int) -> str:
        return self.processor.id_to_piece(index)

    def word_ids(self, pieces: list[str]) -> list[int]:
        """Word number of each piece: a piece starting with '▁' opens a word."""
        return _number_words([i == 0 or piece.startswith("\u2581") for i, piece in enumerate(pieces)])


class VocabularyTokenizer:
    """Characters (``kind='char'``) or whitespace-separated words (``kind='whitespace'``)."""

    def __init__(self, kind: str, symbols: list[str]):
        self.kind = kind
        self.symbols = list(SPECIAL_TOKENS) + [s for s in symbols if s not in SPECIAL_TOKENS]
        self.index = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.vocab_size = len(self.symbols)

    @classmethod
    def train(cls, texts: list[str], vocab_size: int, kind: str) -> "VocabularyTokenizer":
        counts = Counter(symbol for text in texts for symbol in cls.split(kind, text))
        frequent = sorted(counts, key=lambda symbol: (-counts[symbol], symbol))
        return cls(kind, frequent[:max(0, vocab_size - len(SPECIAL_TOKENS))])

    @staticmethod
    def split(kind: str, text: str) -> list[str]:
        return list(text) if kind == "char" else text.split()

    def pieces(self, text: str) -> list[str]:
        return self.split(self.kind, text)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(symbol, UNK_ID) for symbol in self.split(self.kind, text)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: list[int]) -> str:
        symbols = [self.symbols[i] for i in content_ids(ids) if i < self.vocab_size]
        return ("" if self.kind == "char" else " ").join(symbols)

    def id_to_piece(self, index: int) -> str:
        return self.symbols[index]

    def word_ids(self, pieces: list[str]) -> list[int]:
        """Word number of each piece: every piece is a word, or characters up to a space."""
        if self.kind == "whitespace":
            return list(range(len(pieces)))
        return _number_words([i == 0 or pieces[i - 1] == " " for i in range(len(pieces))])


def _number_words(starts: list[bool]) -> list[int]:
    numbers, current = [], -1
    for start in starts:
        current += start
        numbers.append(current)
    return numbers


Tokenizer = SentencePieceTokenizer | VocabularyTokenizer


def train_tokenizers(config: DataConfig, source: list[str], target: list[str]):
    """``(source tokenizer, target tokenizer)``; the same object twice for a joint vocabulary."""
    def train(texts):
        if config.tokenizer == "sentencepiece":
            return SentencePieceTokenizer.train(texts, config.vocab_size, config.sp_model)
        return VocabularyTokenizer.train(texts, config.vocab_size, config.tokenizer)

    if config.joint_vocab:
        joint = train(source + target)
        return joint, joint
    return train(source), train(target)


def save_tokenizers(folder: Path, source: Tokenizer, target: Tokenizer) -> None:
    """Write ``tokenizer.json`` (and SentencePiece models) into a run directory."""
    description = {"joint": source is target}
    for side, tokenizer in (("source", source), ("target", target)):
        if isinstance(tokenizer, SentencePieceTokenizer):
            model_name = "spm.joint.model" if source is target else f"spm.{side}.model"
            (folder / model_name).write_bytes(tokenizer.model_bytes)
            description[side] = {"kind": "sentencepiece", "model": model_name}
        else:
            description[side] = {"kind": tokenizer.kind, "symbols": tokenizer.symbols}
    (folder / TOKENIZER_FILE).write_text(json.dumps(description, ensure_ascii=False, indent=1),
                                         encoding="utf-8")


def load_tokenizers(folder: Path):
    """``(source, target)`` tokenizers saved by :func:`save_tokenizers`."""
    path = folder / TOKENIZER_FILE
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
        loaded = [_load_one(folder, description[side]) for side in ("source", "target")]
    except FileNotFoundError as error:
        raise UserError(f"missing tokenizer file in run directory: {error.filename}") from None
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as error:
        raise UserError(f"{path} is not a valid attnmt tokenizer description ({error})") from None
    if description.get("joint"):
        return loaded[0], loaded[0]
    return loaded[0], loaded[1]


def _load_one(folder: Path, entry: dict) -> Tokenizer:
    if entry["kind"] == "sentencepiece":
        return SentencePieceTokenizer((folder / entry["model"]).read_bytes())
    symbols = entry["symbols"][len(SPECIAL_TOKENS):]
    return VocabularyTokenizer(entry["kind"], symbols)
