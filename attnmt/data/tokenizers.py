"""Tokenizers saved in a run directory: SentencePiece (unigram or BPE), characters, whitespace.

Every tokenizer uses the fixed special ids of :mod:`attnmt.data` (pad 0, bos 1, eos 2,
unk 3) and offers ``encode(text) -> ids``, ``decode(ids) -> text``, ``pieces(text)``
and ``vocab_size``. ``encode`` adds no BOS/EOS; batching does that. Texts are
normalised first (:mod:`attnmt.data.normalize`), in training and in translation alike.

Tags (``<bt>``, ``<2de>``, see :class:`attnmt.config.DataConfig`) are pieces of their own
that only attnmt puts in front of a source: ``encode``, ``encode_batch`` and ``pieces``
read their text as text, so a ``<2fr>`` typed by a user is the characters it shows, never
a tag. Training corpora, whose sources attnmt tags itself, go through
``encode_tagged_batch`` and ``sample_batch``, which take the tags that start a text as
tags (and the rest as text); the translator adds tags by id (``tag_ids``).
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from attnmt.config import DataConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID
from attnmt.data.normalize import NORMALIZATIONS, normalize
from attnmt.errors import UserError

TOKENIZER_FILE = "tokenizer.json"
_TAG_LIKE = re.compile(r"<[^<>\s]+>")
BATCH_ENCODE_FROM = 256                 # texts from which SentencePiece's threads pay


def content_ids(ids) -> list[int]:
    """Token ids without padding, BOS and EOS."""
    return [i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)]


def split_tags(text: str, tags) -> tuple[list[str], str]:
    """The tags that start ``text`` (each followed by a space), and the text after them."""
    found = []
    while tags:
        head, space, rest = text.partition(" ")
        if head not in tags:
            break
        found.append(head)
        text = rest
    return found, text


class SentencePieceTokenizer:
    """Tags are pieces of their own (user-defined symbols) that only ever start a text: they
    are split off before SentencePiece sees it, so no word-start piece stands before them.
    Text is encoded by the same model with the tags marked unused: SentencePiece would
    otherwise match a user-defined symbol anywhere in a text."""
    kind = "sentencepiece"

    def __init__(self, model_bytes: bytes, normalization: str = "nfkc", tags: tuple[str, ...] = ()):
        self.model_bytes, self.normalization, self.tags = model_bytes, normalization, tuple(tags)
        processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        self.vocab_size = processor.get_piece_size()
        self.tag_ids = {tag: processor.piece_to_id(tag) for tag in self.tags}
        self.processor = _without_symbols(model_bytes) if self.tags else processor

    @classmethod
    def train(cls, texts: list[str], vocab_size: int, model_type: str,
              tags: tuple[str, ...] = ()) -> "SentencePieceTokenizer":
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=(normalize(split_tags(text, tags)[1]) for text in texts),
            model_writer=model,
            vocab_size=vocab_size, user_defined_symbols=list(tags),
            model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
            normalization_rule_name="identity", pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            unk_id=UNK_ID, pad_piece=SPECIAL_TOKENS[0], bos_piece=SPECIAL_TOKENS[1],
            eos_piece=SPECIAL_TOKENS[2], unk_piece=SPECIAL_TOKENS[3], input_sentence_size=2_000_000,
            shuffle_input_sentence=True, num_threads=2, minloglevel=2)
        return cls(model.getvalue(), tags=tags)

    def normalize(self, text: str) -> str:
        return normalize(text, self.normalization)

    def _parts(self, texts: list[str]) -> tuple[list[list[int]], list[str]]:
        """Each text's leading tag ids and its normalised rest."""
        split = [split_tags(text, self.tag_ids) for text in texts]
        return ([[self.tag_ids[tag] for tag in tags] for tags, _ in split],
                [self.normalize(rest) for _, rest in split])

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of plain texts (a tag in them is text). SentencePiece's own batch
        encoding starts threads: it pays from a few hundred texts on, and costs 20 us to
        several ms on a handful (a server's request), so those are encoded one by one
        (about 2 us each)."""
        rests = [self.normalize(text) for text in texts]
        if len(rests) >= BATCH_ENCODE_FROM:
            return self.processor.encode(rests)
        return [self.processor.encode(rest) for rest in rests]

    def encode_tagged_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of training sources: the tags that start a text, then its text."""
        return _tagged(self, texts)

    def sample_batch(self, texts: list[str], alpha: float, nbest: int) -> list[list[int]]:
        """One sampled segmentation per text (subword regularisation): unigram models sample
        from the ``nbest`` best (``-1``: all) with smoothing ``alpha``; BPE models drop
        merges with probability ``alpha`` (BPE-dropout)."""
        tags, rests = self._parts(texts)
        sampled = self.processor.encode(rests, enable_sampling=True, alpha=alpha, nbest_size=nbest)
        return [ids + encoded for ids, encoded in zip(tags, sampled)]

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(content_ids(ids))

    def pieces(self, text: str) -> list[str]:
        """The pieces of a plain text (a tag in it is text)."""
        return self.processor.encode(self.normalize(text), out_type=str)

    def id_to_piece(self, index: int) -> str:
        return self.processor.id_to_piece(index)

    def word_ids(self, pieces: list[str]) -> list[int]:
        return _sentencepiece_word_ids(pieces)


class MarianVocabularyTokenizer:
    """One side of an imported MarianMT model: its SentencePiece model cuts a text into
    pieces, and its ``vocab.json`` (not the SentencePiece ids) numbers them, a piece it does
    not hold being ``<unk>``, as transformers' ``MarianTokenizer`` does. attnmt's fixed ids
    come first: 0 is attnmt's own ``<pad>`` (MarianMT has no such row; the model leaves it out
    of its softmax), 1 is MarianMT's ``<pad>`` (its decoder's start, attnmt's ``<s>``), 2 its
    ``</s>``, 3 its ``<unk>``; then every other entry in MarianMT's order. A leading language
    code (``>>fr<<``) is the token it names, as in MarianMT."""
    kind = "marian"
    PADDING = "<attnmt-pad>"                     # the piece of id 0, which no text produces

    def __init__(self, model_bytes: bytes, vocabulary: list[str], normalization: str = "nfkc"):
        self.model_bytes, self.vocabulary, self.normalization = model_bytes, list(vocabulary), normalization
        self.tags = ()
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        specials = [vocabulary.index(token) for token in ("<pad>", "</s>", "<unk>")]
        rest = [index for index in range(len(vocabulary)) if index not in specials]
        self.marian_ids = [None, *specials, *rest]          # attnmt id -> MarianMT id (0: none)
        self.symbols = [self.PADDING] + [vocabulary[index] for index in self.marian_ids[1:]]
        self.index = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.vocab_size = len(self.symbols)
        self.tag_ids = {}

    def normalize(self, text: str) -> str:
        return normalize(text, self.normalization)

    def pieces(self, text: str) -> list[str]:
        text = self.normalize(text)
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1 and text[:end + 2] in self.index:
            code, text = [text[:end + 2]], text[end + 2:]
        return code + self.processor.encode(text, out_type=str)

    def encode(self, text: str) -> list[int]:
        return [self.index.get(piece, UNK_ID) for piece in self.pieces(text)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_tagged_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encode_batch(texts)

    def sample_batch(self, texts: list[str], alpha: float, nbest: int) -> list[list[int]]:
        """Subword regularisation: a sampled segmentation, numbered by the vocabulary."""
        sampled = self.processor.encode([self.normalize(text) for text in texts], out_type=str,
                                        enable_sampling=True, alpha=alpha, nbest_size=nbest)
        return [[self.index.get(piece, UNK_ID) for piece in pieces] for pieces in sampled]

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens (``<unk>`` too) left out, as
        ``MarianTokenizer.decode(..., skip_special_tokens=True)`` gives it."""
        pieces = [self.symbols[i] for i in ids if UNK_ID < i < self.vocab_size]
        return self.processor.decode_pieces(pieces).replace("\u2581", " ").strip()

    def id_to_piece(self, index: int) -> str:
        return self.symbols[index]

    def word_ids(self, pieces: list[str]) -> list[int]:
        return _sentencepiece_word_ids(pieces)


def _without_symbols(model_bytes: bytes) -> spm.SentencePieceProcessor:
    """The SentencePiece model with its user-defined symbols (the tags) marked unused: the
    same pieces and ids, but no text is ever cut into a tag."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_bytes)
    for piece in proto.pieces:
        if piece.type == piece.USER_DEFINED:
            piece.type = piece.UNUSED
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


class VocabularyTokenizer:
    """Characters (``kind='char'``) or whitespace-separated words (``kind='whitespace'``).
    A tag typed in a text is a word this vocabulary does not know (``<unk>``)."""

    def __init__(self, kind: str, symbols: list[str], normalization: str = "nfkc",
                 tags: tuple[str, ...] = ()):
        self.kind, self.normalization, self.tags = kind, normalization, tuple(tags)
        self.symbols = list(SPECIAL_TOKENS) + [s for s in symbols if s not in SPECIAL_TOKENS]
        self.index = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.vocab_size = len(self.symbols)
        self.tag_ids = {tag: self.index[tag] for tag in self.tags if tag in self.index}

    @classmethod
    def train(cls, texts: list[str], vocab_size: int, kind: str,
              tags: tuple[str, ...] = ()) -> "VocabularyTokenizer":
        counts = Counter(symbol for text in texts for symbol in cls.split(kind, normalize(text)))
        frequent = [symbol for symbol in sorted(counts, key=lambda symbol: (-counts[symbol], symbol))
                    if symbol not in tags]
        return cls(kind, [*tags, *frequent][:max(0, vocab_size - len(SPECIAL_TOKENS))], tags=tags)

    @staticmethod
    def split(kind: str, text: str) -> list[str]:
        return list(text) if kind == "char" else text.split()

    def pieces(self, text: str) -> list[str]:
        return self.split(self.kind, normalize(text, self.normalization))

    def encode(self, text: str) -> list[int]:
        return [UNK_ID if symbol in self.tag_ids else self.index.get(symbol, UNK_ID)
                for symbol in self.pieces(text)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode_tagged_batch(self, texts: list[str]) -> list[list[int]]:
        """The ids of training sources: the tags that start a text, then its text."""
        return _tagged(self, texts)

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


def _tagged(tokenizer, texts: list[str]) -> list[list[int]]:
    """``encode_tagged_batch`` of either tokenizer: leading tags by id, the rest as text."""
    split = [split_tags(text, tokenizer.tag_ids) for text in texts]
    encoded = tokenizer.encode_batch([rest for _, rest in split])
    return [[tokenizer.tag_ids[tag] for tag in tags] + ids for (tags, _), ids in zip(split, encoded)]


def _sentencepiece_word_ids(pieces: list[str]) -> list[int]:
    """Word number of each SentencePiece piece: a piece starting with '▁' opens a word."""
    return _number_words([i == 0 or piece.startswith("\u2581") for i, piece in enumerate(pieces)])


def _number_words(starts: list[bool]) -> list[int]:
    numbers, current = [], -1
    for start in starts:
        current += start
        numbers.append(current)
    return numbers


Tokenizer = SentencePieceTokenizer | VocabularyTokenizer | MarianVocabularyTokenizer


def train_tokenizers(config: DataConfig, source: list[str], target: list[str]):
    """``(source tokenizer, target tokenizer)``; the same object twice for a joint vocabulary.
    With ``data.tokenizer_from``, that run's tokenizers instead (checked by
    :func:`attnmt.run.inherit`)."""
    if config.tokenizer_from:
        return load_tokenizers(Path(config.tokenizer_from))

    def train(texts, tags):
        if config.tokenizer == "sentencepiece":
            return SentencePieceTokenizer.train(texts, config.vocab_size, config.sp_model, tags)
        return VocabularyTokenizer.train(texts, config.vocab_size, config.tokenizer, tags)

    if config.joint_vocab:
        joint = train(source + target, config.tags)
        return joint, joint
    return train(source, config.tags), train(target, ())


def save_tokenizers(folder: Path, source: Tokenizer, target: Tokenizer) -> None:
    """Write ``tokenizer.json`` (and SentencePiece models) into a run directory."""
    description = {"joint": source is target, "normalization": source.normalization}
    for side, tokenizer in (("source", source), ("target", target)):
        if isinstance(tokenizer, MarianVocabularyTokenizer):
            (folder / f"spm.{side}.model").write_bytes(tokenizer.model_bytes)
            (folder / f"vocab.{side}.json").write_text(json.dumps(tokenizer.vocabulary, ensure_ascii=False),
                                                      encoding="utf-8")
            description[side] = {"kind": "marian", "model": f"spm.{side}.model",
                                 "vocabulary": f"vocab.{side}.json"}
        elif isinstance(tokenizer, SentencePieceTokenizer):
            model_name = "spm.joint.model" if source is target else f"spm.{side}.model"
            (folder / model_name).write_bytes(tokenizer.model_bytes)
            description[side] = {"kind": "sentencepiece", "model": model_name,
                                 "tags": list(tokenizer.tags)}
        else:
            description[side] = {"kind": tokenizer.kind, "symbols": tokenizer.symbols,
                                 "tags": list(tokenizer.tags)}
    (folder / TOKENIZER_FILE).write_text(json.dumps(description, ensure_ascii=False, indent=1),
                                         encoding="utf-8")


def load_tokenizers(folder: Path):
    """``(source, target)`` tokenizers saved by :func:`save_tokenizers`."""
    path = folder / TOKENIZER_FILE
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
        normalization = description.get("normalization", "controls")    # older runs: see normalize.py
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"unknown normalization {normalization!r}")
        loaded = [_load_one(folder, description[side], normalization) for side in ("source", "target")]
    except FileNotFoundError as error:
        raise UserError(f"missing tokenizer file in run directory: {error.filename}") from None
    except (KeyError, TypeError, ValueError, RuntimeError, OSError) as error:
        raise UserError(f"{path} is not a valid attnmt tokenizer description ({error})") from None
    if description.get("joint"):
        return loaded[0], loaded[0]
    return loaded[0], loaded[1]


def _load_one(folder: Path, entry: dict, normalization: str) -> Tokenizer:
    if entry["kind"] == "marian":
        vocabulary = json.loads((folder / entry["vocabulary"]).read_text(encoding="utf-8"))
        return MarianVocabularyTokenizer((folder / entry["model"]).read_bytes(), vocabulary, normalization)
    if entry["kind"] == "sentencepiece":
        return SentencePieceTokenizer((folder / entry["model"]).read_bytes(), normalization,
                                      tuple(entry.get("tags", ())))
    symbols = entry["symbols"][len(SPECIAL_TOKENS):]
    # Runs saved before tags were listed: their tags are the symbols written like one.
    tags = entry["tags"] if "tags" in entry else [s for s in symbols if _TAG_LIKE.fullmatch(s)]
    return VocabularyTokenizer(entry["kind"], symbols, normalization, tuple(tags))
