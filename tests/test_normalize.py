import json

import pytest

from attnmt.data.normalize import normalize
from attnmt.data.tokenizers import SentencePieceTokenizer, load_tokenizers, save_tokenizers


@pytest.mark.parametrize("text,expected", [
    ("Ein Hund rennt.", "Ein Hund rennt."),
    ("  Ein   Hund \t rennt.\r ", "Ein Hund rennt."),
    ("   \t \n", ""),
    ("\x00\x01Hund\x1b[0m", "Hund[0m"),
    ("Ein\u00a0Hund", "Ein Hund"),                 # no-break space
    ("\ufeffZwei\u200bHunde\u00ad", "ZweiHunde"),  # BOM, zero-width space, soft hyphen
    ("ﬁsh ＡＢＣ", "fish ABC"),                     # ligature, full-width letters
    ("Bär", "Bär"),                                # decomposed umlaut composed
    ("Strasse\u2028Haus", "Strasse Haus"),         # line separator is whitespace
])
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_controls_form_keeps_compatibility_characters():
    assert normalize("ﬁsh\x00 \t Ein\u00a0Hund", "controls") == "ﬁsh Ein Hund"


def test_tokenizer_normalizes_in_training_and_encoding(tmp_path):
    texts = ["ein hund rennt", "zwei hunde rennen", "drei katzen schlafen"] * 30
    tokenizer = SentencePieceTokenizer.train(texts, 40, "unigram", tags=("<2fr>",))
    assert tokenizer.encode("ein\x00 hund\t rennt") == tokenizer.encode("ein hund rennt")
    assert tokenizer.encode("  \t\x01 ") == []
    tag = tokenizer.tag_ids["<2fr>"]
    assert tokenizer.encode_tagged_batch(["<2fr> ein hund"]) == [[tag, *tokenizer.encode("ein hund")]]
    typed = tokenizer.encode("<2fr> ein hund")              # a tag typed in a text is text
    assert tag not in typed and typed[-len(tokenizer.encode("ein hund")):] == tokenizer.encode("ein hund")
    assert "<2fr>" not in tokenizer.pieces("ein <2fr> hund")
    save_tokenizers(tmp_path, tokenizer, tokenizer)
    loaded, _ = load_tokenizers(tmp_path)
    assert loaded.normalization == "nfkc" and loaded.encode("ein hund") == tokenizer.encode("ein hund")


def test_runs_from_before_normalisation_keep_their_encoding(tmp_path):
    """A tokenizer.json without "normalization" (runs trained before it) folds no Unicode
    compatibility forms, so ordinary text encodes exactly as before; controls still go."""
    texts = ["ein hund rennt", "zwei hunde rennen", "ﬁsh im see"] * 30
    tokenizer = SentencePieceTokenizer.train(texts, 40, "unigram")
    save_tokenizers(tmp_path, tokenizer, tokenizer)
    description = json.loads((tmp_path / "tokenizer.json").read_text())
    del description["normalization"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(description))
    old, _ = load_tokenizers(tmp_path)
    assert old.normalization == "controls"
    assert old.pieces("ﬁsh") == tokenizer.processor.encode("ﬁsh", out_type=str)
    assert old.encode("ein\x00hund") == tokenizer.processor.encode("einhund")


def test_batch_encoding_is_the_same_below_and_above_the_threaded_size():
    from attnmt.data.tokenizers import BATCH_ENCODE_FROM

    texts = ["ein hund rennt", "zwei\u00a0hunde rennen", "<2fr> drei katzen", "  "] * 30
    tokenizer = SentencePieceTokenizer.train(texts, 40, "unigram", tags=("<2fr>",))
    many = texts * (BATCH_ENCODE_FROM // len(texts) + 1)
    assert len(many) >= BATCH_ENCODE_FROM > len(texts)
    assert tokenizer.encode_batch(many) == [tokenizer.encode(text) for text in many]
    assert tokenizer.encode_batch(texts) == tokenizer.encode_batch(many)[:len(texts)]
