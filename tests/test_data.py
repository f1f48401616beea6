import gzip
import os
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from attnmt.config import DataConfig
from attnmt.data import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attnmt.data.batching import source_batches, token_batches
from attnmt.data.tensors import make_batch
from attnmt.data.corpus import ParallelCorpus, read_multi30k, read_parallel
from attnmt.config import load_config
from attnmt.data.datasets import (load_segmentation, load_split, resample_subwords,
                                  save_segmentation, tokenize_split)
from attnmt.data.numbers import numbers_corpus, split_integers
from attnmt.data.tokenizers import load_tokenizers, save_tokenizers, train_tokenizers
from attnmt.errors import UserError



def write(path: Path, lines: list[str], compress: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_reads_prefix_and_languages_with_gzip(tmp_path):
    write(tmp_path / "train.de", ["ein Hund", "zwei Katzen"])
    write(tmp_path / "train.en.gz", ["a dog", "two cats"], compress=True)
    corpus = read_parallel(tmp_path / "train", "de", "en")
    assert corpus.source == ["ein Hund", "zwei Katzen"] and corpus.target == ["a dog", "two cats"]


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write(tmp_path / "train.de", ["a", "b", "c"])
    write(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(UserError, match=r"line counts differ: .*train.de has 3 lines, .*train.en has 2"):
        read_parallel(tmp_path / "train", "de", "en")


def test_missing_file(tmp_path):
    write(tmp_path / "train.de", ["a"])
    with pytest.raises(UserError, match=r"file not found: .*train.en \(nor .*train.en.gz\)"):
        read_parallel(tmp_path / "train", "de", "en")


def test_bad_utf8_names_file_and_line(tmp_path):
    write(tmp_path / "train.de", ["gut", "auch gut"])
    (tmp_path / "train.en").write_bytes(b"fine\nbroken \xff here\n")
    with pytest.raises(UserError, match=r"train.en: line 2 is not valid UTF-8"):
        read_parallel(tmp_path / "train", "de", "en")


def test_tsv_corpus_and_its_errors(tmp_path):
    write(tmp_path / "pairs.tsv", ["hallo\thello", "welt\tworld"])
    assert read_parallel(tmp_path / "pairs.tsv", "de", "en").target == ["hello", "world"]
    write(tmp_path / "bad.tsv", ["hallo\thello", "only one field"])
    with pytest.raises(UserError, match="line 2 has 1 tab-separated fields, expected 2"):
        read_parallel(tmp_path / "bad.tsv", "de", "en")


def test_filtering_is_reported_and_an_empty_training_set_refused():
    tokenizer = train_tokenizers(DataConfig(tokenizer="whitespace", vocab_size=50), ["a b c"], ["x"])[0]
    corpus = ParallelCorpus(["a b", "", "a b c a b c"], ["a", "b", "c"], "toy")
    split, report = tokenize_split(corpus, tokenizer, tokenizer, max_len=4)
    assert len(split) == 1
    assert report == "toy: 3 pairs, kept 1 (dropped 1 empty, 1 longer than 4 tokens)"
    with pytest.raises(UserError, match="no training pairs left after filtering"):
        tokenize_split(corpus, tokenizer, tokenizer, max_len=1)


def test_numbers_splits_are_disjoint_and_deterministic():
    sizes = {"train": 300, "valid": 50, "test": 50}
    splits = split_integers(999, sizes, seed=3)
    assert {len(v) for v in splits.values()} == {300, 50}
    assert not set(splits["train"]) & set(splits["test"])
    assert not set(splits["valid"]) & set(splits["test"]) | set(splits["train"]) & set(splits["valid"])
    assert split_integers(999, sizes, seed=3) == splits
    assert split_integers(999, sizes, seed=4) != splits


def test_numbers_corpus_crosses_alignments():
    corpus = numbers_corpus("train", "de", "en", 99, {"train": 100, "valid": 0, "test": 0}, seed=1)
    pairs = dict(zip(corpus.source, corpus.target))
    assert pairs["vierundzwanzig"] == "twenty-four"
    french = numbers_corpus("train", "de", "fr", 99, {"train": 100, "valid": 0, "test": 0}, seed=1)
    assert "quatre-vingt-dix-sept" in french.target


def test_numbers_errors():
    with pytest.raises(UserError, match="only 100 integers in 0..99"):
        split_integers(99, {"train": 90, "valid": 10, "test": 10}, seed=1)
    with pytest.raises(UserError, match="num2words has no language 'xx'"):
        numbers_corpus("train", "xx", "en", 99, {"train": 10, "valid": 0, "test": 0}, seed=1)


TEXTS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!", "Größe: 3,5 m — naïve café"]


@pytest.mark.parametrize("kind,model,joint", [("sentencepiece", "unigram", True),
                                              ("sentencepiece", "bpe", False),
                                              ("char", "unigram", True),
                                              ("whitespace", "unigram", False)])
def test_tokenizers_round_trip_and_reload(tmp_path, kind, model, joint):
    config = DataConfig(tokenizer=kind, sp_model=model, vocab_size=60, joint_vocab=joint)
    source, target = train_tokenizers(config, TEXTS * 20, [t.lower() for t in TEXTS] * 20)
    assert (source is target) == joint
    for text in TEXTS:
        ids = source.encode(text)
        assert min(ids) > EOS_ID and UNK_ID not in ids
        assert source.decode([BOS_ID] + ids + [EOS_ID, PAD_ID]) == text
    save_tokenizers(tmp_path, source, target)
    loaded_source, loaded_target = load_tokenizers(tmp_path)
    assert loaded_source.encode(TEXTS[1]) == source.encode(TEXTS[1])
    assert loaded_target.vocab_size == target.vocab_size
    assert (loaded_source is loaded_target) == joint


@pytest.mark.parametrize("model,alpha", [("unigram", 0.3), ("bpe", 0.3)])
def test_subword_sampling_changes_pieces_never_text(tmp_path, model, alpha):
    corpus = ParallelCorpus(TEXTS * 30, [t.lower() for t in TEXTS] * 30, "sample")
    config = DataConfig(sp_model=model, vocab_size=80, joint_vocab=False)
    source, target = train_tokenizers(config, corpus.source, corpus.target)
    plain, _ = tokenize_split(corpus, source, target)
    first = resample_subwords(plain, source, target, alpha, -1)
    second = resample_subwords(plain, source, target, alpha, -1)
    changed = sum(a != b for a, b in zip(first.sources + first.targets, plain.sources + plain.targets))
    assert changed > len(corpus.source) // 4                        # pieces change ...
    assert first.sources != second.sources                            # ... anew every call
    for split in (first, second):
        assert [source.decode(ids) for ids in split.sources] == corpus.source   # text never
        assert [target.decode(ids) for ids in split.targets] == corpus.target
        assert list(split.src_lengths) == [len(ids) for ids in split.sources]
    save_segmentation(first, tmp_path / "epoch_0.npz")
    again = load_segmentation(plain, tmp_path / "epoch_0.npz")
    assert (again.sources, again.targets) == (first.sources, first.targets)


def sampling_trainer(tiny_config, run_path: Path, overrides: list[str]):
    """A Trainer of the tiny config with ``overrides``, for calling ``training_split``."""
    from attnmt.run import RunDirectory, prepare_data
    from attnmt.train import Trainer

    config = load_config(tiny_config, overrides)
    run = RunDirectory(run_path)
    run.path.mkdir()
    return Trainer(config, run, prepare_data(config, run))


def test_subword_sampling_is_off_at_validation_and_needs_raw_text(tiny_config, tmp_path):
    from attnmt.run import RunDirectory, prepare_data, prepare_run

    trainer = sampling_trainer(tiny_config, tmp_path / "run", ["data.subword_sampling=0.5"])
    config = trainer.config
    epochs = [trainer.training_split(epoch) for epoch in (0, 1)]
    assert epochs[0].sources != epochs[1].sources != trainer.data.train.sources
    valid = trainer.data.valid
    assert valid.sources == trainer.data.source_tokenizer.encode_batch(valid.corpus.source)
    prepare_run(tiny_config, tmp_path / "prepared")
    with pytest.raises(UserError, match="data.subword_sampling needs the raw training text"):
        prepare_data(config, RunDirectory(tmp_path / "prepared"))
    with pytest.raises(UserError, match="prepare and train with --set data.subword_sampling=0"):
        prepare_run(tiny_config, tmp_path / "refused", ["data.subword_sampling=0.5"])
    assert not (tmp_path / "refused").exists()


def test_subword_sampling_starts_at_its_epoch(tiny_config, tmp_path):
    trainer = sampling_trainer(tiny_config, tmp_path / "run",
                               ["data.subword_sampling=0.5", "data.subword_sampling_from_epoch=2"])
    run = trainer.run
    fixed = trainer.data.train
    assert trainer.training_split(0) is fixed and trainer.training_split(1) is fixed
    assert not run.segmentation(1).exists()
    assert trainer.training_split(2).sources != fixed.sources
    assert run.segmentation(2).is_file()
    with pytest.raises(UserError, match="data.subword_sampling_from_epoch must be >= 0, got -1"):
        load_config(tiny_config, ["data.subword_sampling_from_epoch=-1"])


def test_unknown_symbols_map_to_unk():
    tokenizer = train_tokenizers(DataConfig(tokenizer="char", vocab_size=60), ["abc"], ["abc"])[0]
    assert tokenizer.encode("abz") == tokenizer.encode("ab")[:2] + [UNK_ID]


def test_corrupt_tokenizer_description(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="tokenizer.json is not a valid attnmt tokenizer"):
        load_tokenizers(tmp_path)


def lengths(seed=0, count=500):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, count), rng.integers(1, 40, count)


def test_token_batches_cover_every_pair_once_within_budget():
    src, tgt = lengths()
    batches = token_batches(src, tgt, batch_tokens=300, seed=1, epoch=0)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(500))
    for batch in batches:
        longest = max(max(src[i], tgt[i]) + 1 for i in batch)
        assert len(batch) * longest <= 300 or len(batch) == 1


def test_token_batches_deterministic_per_epoch():
    src, tgt = lengths()
    first = token_batches(src, tgt, 300, seed=1, epoch=0)
    assert token_batches(src, tgt, 300, seed=1, epoch=0) == first
    assert token_batches(src, tgt, 300, seed=1, epoch=1) != first
    assert token_batches(src, tgt, 300, seed=2, epoch=0) != first


def batch_shapes(batches, src, tgt, pad_multiple):
    """(B, S, T) of every batch's tensors."""
    shapes = []
    for indices in batches:
        batch = make_batch([[5] * src[i] for i in indices], [[6] * tgt[i] for i in indices], indices,
                           pad_multiple)
        shapes.append((len(indices), batch.src.size(1), batch.tgt_out.size(1)))
    return shapes


def test_padded_batches_come_in_few_shapes_that_repeat_every_epoch():
    src, tgt = lengths(count=3000)
    padded = token_batches(src, tgt, 300, seed=1, epoch=0, pad_multiple=8)
    assert sorted(i for batch in padded for i in batch) == list(range(3000))
    shapes = batch_shapes(padded, src, tgt, 8)
    for count, source, target in shapes:
        assert source % 8 == 0 and target % 8 == 0
        assert count * max(source, target) <= 300 or count == 1
    exact = batch_shapes(token_batches(src, tgt, 300, seed=1, epoch=0), src, tgt, 1)
    assert len(set(shapes)) * 4 < len(set(exact))
    next_epoch = batch_shapes(token_batches(src, tgt, 300, seed=1, epoch=1, pad_multiple=8), src, tgt, 8)
    assert sorted(next_epoch) == sorted(shapes)
    in_order = [i for batch in token_batches(src, tgt, 300, shuffle=False, pad_multiple=8) for i in batch]
    keys = [(-(-(tgt[i] + 1) // 8), -(-(src[i] + 1) // 8)) for i in in_order]
    assert keys == sorted(keys), "sentences are not sorted by their padded lengths"


def test_oversized_example_gets_its_own_batch():
    batches = token_batches(np.array([5, 500, 5]), np.array([5, 5, 5]), 100, shuffle=False)
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def test_source_batches_longest_first():
    batches = source_batches([3, 9, 1, 5], batch_tokens=20)
    assert batches[0][0] == 1 and sorted(i for b in batches for i in b) == [0, 1, 2, 3]


def test_make_batch_adds_bos_and_eos():
    batch = make_batch([[5, 6], [7]], [[8], [9, 10]], [0, 1])
    assert batch.src.tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, PAD_ID], [BOS_ID, 9, 10]]
    assert batch.tgt_out.tolist() == [[8, EOS_ID, PAD_ID], [9, 10, EOS_ID]]
    assert batch.target_tokens == 5 and batch.tgt_mask.shape == (2, 3, 3)
    padded = make_batch([[5, 6], [7]], [[8], [9, 10]], [0, 1], pad_multiple=4)
    assert padded.src.tolist() == [[5, 6, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID]]
    assert padded.tgt_out.tolist() == [[8, EOS_ID, PAD_ID, PAD_ID], [9, 10, EOS_ID, PAD_ID]]
    assert padded.target_tokens == 5


def test_files_dataset_needs_its_paths():
    with pytest.raises(UserError, match="data.train is not set"):
        load_split(DataConfig(dataset="files"), "train")


def test_extra_source_languages_join_training_only(tmp_path):
    for split, lines in (("train", ["eins", "zwei"]), ("valid", ["drei"])):
        write(tmp_path / f"{split}.de", lines)
        write(tmp_path / f"{split}.en", [f"{line}-en" for line in lines])
    write(tmp_path / "train.fr", ["un", "deux", "trois"])
    config = DataConfig(dataset="files", train=str(tmp_path / "train"), valid=str(tmp_path / "valid"),
                        extra_src_langs=("fr",))
    with pytest.raises(UserError, match=r"line counts differ: .*train.fr has 3 lines, .*train.en has 2"):
        load_split(config, "train")
    write(tmp_path / "train.fr", ["un", "deux"])
    train = load_split(config, "train")
    assert train.source == ["eins", "zwei", "un", "deux"]
    assert train.target == ["eins-en", "zwei-en", "eins-en", "zwei-en"]
    assert load_split(config, "valid").source == ["drei"]


def test_numbers_spells_the_same_integers_in_the_extra_language():
    config = DataConfig(dataset="numbers", numbers_max=99, numbers_train=5, numbers_valid=2,
                        numbers_test=2, extra_src_langs=("fr",))
    train = load_split(config, "train")
    assert len(train) == 10 and train.target[:5] == train.target[5:]
    assert train.source[5:] == numbers_corpus("train", "fr", "en", 99, {"train": 5, "valid": 2,
                                                                        "test": 2}, seed=1).source


def test_multi30k_french_pairs_join_german_training(multi30k_dir):
    config = DataConfig(dataset="multi30k", dir=str(multi30k_dir), extra_src_langs=("fr",))
    train = load_split(config, "train")
    german = read_multi30k("train", "de", "en", str(multi30k_dir))
    assert len(train) == 2 * len(german) and train.target[len(german):] == german.target
    assert train.source[:len(german)] == german.source
    assert train.source[len(german):][:50] == read_multi30k("train", "fr", "en", str(multi30k_dir)).source[:50]
    assert len(load_split(config, "valid")) == 1014


def test_extra_target_languages_tag_every_source_with_its_language(tmp_path):
    for split, lines in (("train", ["eins", "zwei"]), ("valid", ["drei"])):
        write(tmp_path / f"{split}.de", lines)
        write(tmp_path / f"{split}.en", [f"{line}-en" for line in lines])
    write(tmp_path / "train.fr", ["un", "deux"])
    config = DataConfig(dataset="files", train=str(tmp_path / "train"), valid=str(tmp_path / "valid"),
                        extra_tgt_langs=("fr",))
    train = load_split(config, "train")
    assert train.source == ["<2en> eins", "<2en> zwei", "<2fr> eins", "<2fr> zwei"]
    assert train.target == ["eins-en", "zwei-en", "un", "deux"]
    assert load_split(config, "valid").source == ["<2en> drei"]
    assert config.tags == ("<2en>", "<2fr>")


def test_multi30k_czech_is_read(multi30k_dir):
    corpus = read_multi30k("valid", "cs", "en", str(multi30k_dir))
    assert len(corpus) == 1014 and corpus.source[0] and corpus.source[0] != corpus.target[0]


def synthetic_files(tmp_path, real: int, synthetic: int):
    write(tmp_path / "train.de", [f"echt {i}" for i in range(real)])
    write(tmp_path / "train.en", [f"real {i}" for i in range(real)])
    write(tmp_path / "bt.de", [f"synth {i}" for i in range(synthetic)])
    write(tmp_path / "bt.en", [f"mono {i}" for i in range(synthetic)])
    return dict(dataset="files", train=str(tmp_path / "train"), synthetic=(str(tmp_path / "bt"),))


@pytest.mark.parametrize("real,synthetic,ratio,copies,kept", [
    (10, 50, 1.0, 5, 50),      # real repeated to match the synthetic pairs
    (10, 50, 2.0, 2, 40),      # ratio 2: two copies of the real pairs, 40 of the 50 synthetic
    (10, 50, 0.5, 10, 50),
    (10, 3, 1.0, 1, 3),        # fewer synthetic pairs than real: all of them, one copy
    (10, 50, 10.0, 1, 50),
])
def test_synthetic_pairs_are_mixed_at_their_ratio_and_only_they_are_tagged(tmp_path, real, synthetic,
                                                                             ratio, copies, kept):
    config = DataConfig(**synthetic_files(tmp_path, real, synthetic), synthetic_ratio=ratio)
    train = load_split(config, "train")
    assert len(train) == real * copies + kept
    assert train.source[:real * copies] == [f"echt {i}" for i in range(real)] * copies
    mixed = list(zip(train.source[real * copies:], train.target[real * copies:]))
    assert all(source.startswith("<bt> synth ") and target == f"mono {source.split()[-1]}"
               for source, target in mixed)                    # pairs stay pairs
    assert len(set(mixed)) == kept
    assert load_split(config, "train").source == train.source   # the same subset every time
    assert not any("<bt>" in text for text in train.source[:real * copies])


def test_synthetic_tag_can_be_left_out_and_is_checked(tmp_path):
    config = DataConfig(**synthetic_files(tmp_path, 2, 2), synthetic_tag="")
    assert load_split(config, "train").source[2:] == ["synth 0", "synth 1"]
    assert config.tags == ()
    with pytest.raises(UserError, match="data.synthetic_tag must be one word"):
        DataConfig(synthetic_tag="<b t>")
    with pytest.raises(UserError, match="data.synthetic_ratio must be positive"):
        DataConfig(synthetic_ratio=0)


def test_synthetic_tag_reaches_the_model_only_in_training(tmp_path):
    """The tag is one piece at the start of synthetic sources; the validation split and the
    translator never add it."""
    config = DataConfig(**synthetic_files(tmp_path, 20, 20), valid=str(tmp_path / "train"),
                        vocab_size=40)
    train = load_split(config, "train")
    source, target = train_tokenizers(config, train.source, train.target)
    tag_id = source.tag_ids["<bt>"]
    encoded = source.encode_tagged_batch(train.source)
    assert all(ids[0] == tag_id for ids in encoded[20:])
    assert not any(tag_id in ids for ids in encoded[:20])
    assert not any(tag_id in ids for ids in
                   source.encode_tagged_batch(load_split(config, "valid").source))


def test_multi30k_from_local_folder(multi30k_dir):
    corpus = read_multi30k("valid", "de", "en", str(multi30k_dir))
    assert len(corpus) == 1014 and corpus.name == "multi30k/val"


def test_multi30k_absent_without_network_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNMT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    with pytest.raises(UserError, match=r"Multi30k files not found \(looked in .*empty.*\) and the "
                                        r"download failed .*set data.dir or ATTNMT_DATA"):
        read_multi30k("train", "de", "en", str(tmp_path / "empty"))
    assert not any(name.endswith(".gz") for _, _, names in os.walk(tmp_path) for name in names)
