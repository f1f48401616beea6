"""Configuration: one YAML file with sections ``data``, ``model``, ``train``, ``decode``.

``load_config(path, overrides)`` reads it into frozen dataclasses. Unknown keys
are rejected with their name and the allowed ones; impossible values are
rejected with one clear message. Overrides are ``section.key=value`` strings
(the CLI's ``--set``), with values parsed as YAML.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from attnmt.errors import UserError


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("noam", "constant", "plateau", "linear", "wsd")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UserError(message)


def _choice(section: str, name: str, value: str, allowed: tuple[str, ...]) -> None:
    _require(value in allowed, f"{section}.{name} must be one of {', '.join(allowed)}; got {value!r}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "files"            # files | multi30k | numbers
    src_lang: str = "de"
    tgt_lang: str = "en"
    train: str = ""                   # files: prefix (train -> train.de, train.en) or a .tsv file
    valid: str = ""
    test: str = ""
    dir: str = ""                     # multi30k: folder of the raw files (else $ATTNMT_DATA, cache)
    tokenizer: str = "sentencepiece"  # sentencepiece | char | whitespace
    sp_model: str = "unigram"         # unigram | bpe
    vocab_size: int = 8000
    joint_vocab: bool = True
    max_len: int = 100                # training pairs longer than this (in tokens) are dropped
    tokenizer_from: str = ""          # a run whose tokenizers this run uses instead of training
                                      # its own (a shared vocabulary: runs that ensemble); its
                                      # tokenizer settings replace the four above
    subword_sampling: float = 0.0     # > 0: resample training subwords every epoch (SentencePiece):
                                      # unigram smoothing alpha, or the BPE-dropout probability
    subword_nbest: int = -1           # unigram sampling: from the n best (-1: all segmentations)
    subword_sampling_from_epoch: int = 0  # sample only from this epoch on (counted from 0, as in
                                      # log.csv); the epochs before keep the fixed segmentation.
                                      # No effect with subword_sampling: 0
    extra_src_langs: tuple[str, ...] = ()  # training only: pairs from these languages into
                                      # tgt_lang are added (many-to-one), e.g. [fr]; validation
                                      # and test read src_lang only
    extra_tgt_langs: tuple[str, ...] = ()  # training only: pairs from src_lang into these languages
                                      # are added (one-to-many), e.g. [fr, cs]; every source then
                                      # starts with its target language's tag <2xx>, and
                                      # translation chooses the language (--target-lang)
    synthetic: tuple[str, ...] = ()   # training only: corpora of synthetic pairs (back-translations),
                                      # prefixes or .tsv files like data.train
    synthetic_ratio: float = 1.0      # synthetic pairs per real pair in the training split: the real
                                      # pairs are repeated whole times, the synthetic ones cut to fit
    synthetic_tag: str = "<bt>"       # starts every synthetic source ('' for none); never added
                                      # at translation
    synthetic_until: float = 1.0      # the fraction of the training budget after which the
                                      # synthetic pairs leave: the rest trains on the real ones
    numbers_max: int = 99999          # numbers: integers drawn from 0..numbers_max
    numbers_train: int = 20000
    numbers_valid: int = 500
    numbers_test: int = 1000
    numbers_seed: int = 1

    def __post_init__(self):
        _choice("data", "dataset", self.dataset, ("files", "multi30k", "numbers"))
        _choice("data", "tokenizer", self.tokenizer, ("sentencepiece", "char", "whitespace"))
        _choice("data", "sp_model", self.sp_model, ("unigram", "bpe"))
        _require(self.src_lang != self.tgt_lang, "data.src_lang and data.tgt_lang are the same")
        _require(self.vocab_size >= 16, f"data.vocab_size must be at least 16, got {self.vocab_size}")
        _require(self.max_len >= 1, f"data.max_len must be positive, got {self.max_len}")
        _require(self.subword_sampling >= 0,
                 f"data.subword_sampling must be >= 0, got {self.subword_sampling}")
        _require(not self.subword_sampling or self.tokenizer == "sentencepiece",
                 "data.subword_sampling needs tokenizer: sentencepiece")
        _require(self.sp_model != "bpe" or self.subword_sampling < 1,
                 f"data.subword_sampling is the BPE-dropout probability with sp_model: bpe; "
                 f"it must be below 1, got {self.subword_sampling}")
        _require(self.subword_sampling_from_epoch >= 0,
                 f"data.subword_sampling_from_epoch must be >= 0, got {self.subword_sampling_from_epoch}")
        _require(self.subword_nbest == -1 or self.subword_nbest >= 1,
                 f"data.subword_nbest must be -1 (all) or positive, got {self.subword_nbest}")
        _require(not set(self.extra_src_langs) & {self.src_lang, self.tgt_lang}
                 and len(set(self.extra_src_langs)) == len(self.extra_src_langs),
                 f"data.extra_src_langs must list languages other than src_lang and tgt_lang, "
                 f"each once; got {list(self.extra_src_langs)}")
        _require(not set(self.extra_tgt_langs) & {self.src_lang, self.tgt_lang}
                 and len(set(self.extra_tgt_langs)) == len(self.extra_tgt_langs),
                 f"data.extra_tgt_langs must list languages other than src_lang and tgt_lang, "
                 f"each once; got {list(self.extra_tgt_langs)}")
        _require(not (self.extra_src_langs and self.extra_tgt_langs),
                 "data.extra_src_langs (many-to-one) and data.extra_tgt_langs (one-to-many) "
                 "cannot be combined; train one of the two")
        _require(self.synthetic_ratio > 0,
                 f"data.synthetic_ratio must be positive, got {self.synthetic_ratio}")
        _require(0 < self.synthetic_until <= 1,
                 f"data.synthetic_until must be in (0, 1], got {self.synthetic_until}")
        _require(self.synthetic_until == 1 or self.synthetic,
                 "data.synthetic_until needs data.synthetic: without synthetic pairs all training is "
                 "on the real ones")
        _require(self.synthetic_tag == "" or (not any(c.isspace() for c in self.synthetic_tag)
                                              and not self.synthetic_tag.startswith("<2")),
                 f"data.synthetic_tag must be one word, not a language tag <2xx>; "
                 f"got {self.synthetic_tag!r}")
        _require(not self.tags or self.tokenizer != "char",
                 "tags (data.extra_tgt_langs, data.synthetic) need tokenizer: sentencepiece or "
                 "whitespace; the char tokenizer would split them into letters")
        _require(not (self.extra_src_langs or self.extra_tgt_langs) or self.dataset != "files"
                 or not self.train.endswith((".tsv", ".tsv.gz")),
                 f"data.extra_src_langs and extra_tgt_langs need one file per language ({self.train} holds one "
                 f"language pair); give data.train as a prefix, e.g. corpus/train for "
                 f"corpus/train.{self.src_lang}, corpus/train.{self.tgt_lang} and the others")

    @property
    def target_langs(self) -> tuple[str, ...]:
        """The languages the model translates into; the first is the default."""
        return (self.tgt_lang, *self.extra_tgt_langs)

    def target_tag(self, lang: str) -> str:
        """The tag that starts a source translated into ``lang`` ('' for one target language)."""
        return f"<2{lang}>" if len(self.target_langs) > 1 else ""

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag a source may start with: pieces of their own in the vocabulary."""
        tags = tuple(self.target_tag(lang) for lang in self.target_langs if self.target_tag(lang))
        return tags + ((self.synthetic_tag,) if self.synthetic and self.synthetic_tag else ())


ACTIVATIONS = ("relu", "gelu", "swish")


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "transformer"         # transformer | rnn
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    tie_embeddings: str = "decoder"   # none | decoder (input = output) | all (needs a joint vocab)
    # Transformer
    d_model: int = 256
    heads: int = 4
    ffn_dim: int = 1024
    norm: str = "post"                # post (paper) | pre
    positions: str = "sinusoidal"     # sinusoidal | learned
    attention_dropout: float = 0.1    # on attention weights
    ffn_dropout: float = 0.0          # on the FFN's hidden layer
    max_positions: int = 1024
    scale_attention: bool = True      # false: scores q.k without 1/sqrt(d_k) (scaling experiment)
    activation: str = "relu"          # the FFN's: relu (paper) | gelu | swish (OPUS-MT's MarianMT models)
    position_layout: str = "interleaved"  # sinusoids: interleaved sin, cos (paper) | halves [sin | cos] (MarianMT)
    marian_special_tokens: bool = False   # an imported MarianMT model: <s> is its <pad> (the decoder's start,
                                      # never output) and attnmt's own <pad> is left out of the softmax
    # RNN
    cell: str = "gru"                 # rnn | gru | lstm
    decoder: str = "bahdanau"         # none | bahdanau | luong
    attention: str = "additive"       # dot | general | additive | scaled_dot | location
    local_window: int = 0             # > 0: Luong local-p attention with this half-width D
    embed_dim: int = 256
    hidden_dim: int = 256
    bidirectional: bool = True
    attention_dim: int = 256          # additive attention's hidden size; local-p's too
    input_feeding: bool = True        # Luong
    max_source_len: int = 128         # location attention's fixed source length

    def __post_init__(self):
        _choice("model", "arch", self.arch, ("transformer", "rnn"))
        _choice("model", "tie_embeddings", self.tie_embeddings, ("none", "decoder", "all"))
        _choice("model", "norm", self.norm, ("post", "pre"))
        _choice("model", "positions", self.positions, ("sinusoidal", "learned"))
        _choice("model", "activation", self.activation, ACTIVATIONS)
        _choice("model", "position_layout", self.position_layout, ("interleaved", "halves"))
        _choice("model", "cell", self.cell, ("rnn", "gru", "lstm"))
        _choice("model", "decoder", self.decoder, ("none", "bahdanau", "luong"))
        _choice("model", "attention", self.attention,
                ("dot", "general", "additive", "scaled_dot", "location"))
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"model.{name} must be in [0, 1), got {value}")
        for name in ("encoder_layers", "decoder_layers", "d_model", "heads", "ffn_dim",
                     "embed_dim", "hidden_dim", "attention_dim", "max_positions", "max_source_len"):
            _require(getattr(self, name) >= 1, f"model.{name} must be positive, got {getattr(self, name)}")
        _require(self.local_window >= 0, f"model.local_window must be >= 0, got {self.local_window}")
        _require(self.d_model % self.heads == 0,
                 f"model.heads ({self.heads}) must divide model.d_model ({self.d_model})")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1234
    optimizer: str = "adam"           # adam | adamw
    lr: float = 1e-3                  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    weight_decay_on: str = "all"      # all | matrices: not biases and normalisation gains and shifts
    schedule: str = "noam"            # noam | constant | plateau | linear | wsd (attnmt/schedule.py)
    warmup: int = 800                 # updates of linear warmup
    cooldown: float = 0.2             # wsd: the last fraction of the budget, decayed to zero
    plateau_factor: float = 0.5
    plateau_patience: int = 2
    label_smoothing: float = 0.1
    source_word_dropout: float = 0.0  # replace source word pieces by <unk> with this probability
    rdrop: float = 0.0                # > 0: R-Drop, the weight alpha of the KL divergences between two
                                      # dropout passes of each batch (twice the computation per update)
    rdrop_from: float = 0.0           # R-Drop only once this fraction p of the budget is used
    rdrop_from_epoch: int = 0         # ... and only from this epoch on (counted from 0, as in log.csv)
    ffn_dropout_from_epoch: int = 0   # model.ffn_dropout only from this epoch on; 0 before it
    clip_norm: float = 1.0            # 0 = no clipping
    accumulate: int = 1
    batch_tokens: int = 4096          # padded tokens per batch (after accumulation: x accumulate)
    pad_multiple: int = 0             # pad batch lengths to a multiple of this; 0 = 8 for a bf16/fp16
                                      # Transformer on a GPU or a CPU with AMX, else 1
    max_steps: int = 0                # 0 = no limit
    max_epochs: int = 0               # passes over the training data; 0 = no limit
    max_minutes: float = 0.0          # training time; validation and checkpoints not counted
    validate_every: int = 500
    log_every: int = 50
    early_stop_metric: str = "bleu"   # bleu | loss
    patience: int = 0                 # validations without improvement; 0 = never stop early
    keep_checkpoints: int = 3
    average_checkpoints: int = 0      # > 1: average the last n checkpoints at the end; kept as
                                      # best.safetensors if its validation score is better
    ema_decay: float = 0.0            # > 0: keep an exponential moving average of the weights,
                                      # validated beside them; best.safetensors is the better one
    precision: str = "auto"           # auto | fp32 | bf16 | fp16 (CUDA)
    device: str = "auto"              # auto | cpu | cuda
    threads: int = 0                  # torch threads; 0 = all cores
    compile: bool = False
    init_from: str = ""               # a run whose weights (and tokenizers) this run starts from:
                                      # fine-tuning, with a fresh optimizer, schedule and steps
    init_checkpoint: str = "best"     # which of its weights: best | last | a checkpoint file

    def __post_init__(self):
        _choice("train", "optimizer", self.optimizer, ("adam", "adamw"))
        _choice("train", "weight_decay_on", self.weight_decay_on, ("all", "matrices"))
        _choice("train", "schedule", self.schedule, SCHEDULES)
        _choice("train", "early_stop_metric", self.early_stop_metric, ("bleu", "loss"))
        _choice("train", "precision", self.precision, PRECISIONS)
        _choice("train", "device", self.device, DEVICES)
        _require(self.lr > 0, f"train.lr must be positive, got {self.lr}")
        for name in ("label_smoothing", "source_word_dropout"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"train.{name} must be in [0, 1), got {value}")
        for name in ("accumulate", "batch_tokens", "validate_every", "log_every", "keep_checkpoints"):
            _require(getattr(self, name) >= 1, f"train.{name} must be positive, got {getattr(self, name)}")
        for name in ("warmup", "max_steps", "max_epochs", "max_minutes", "patience", "clip_norm",
                     "weight_decay", "threads", "average_checkpoints", "pad_multiple", "rdrop",
                     "rdrop_from_epoch", "ffn_dropout_from_epoch"):
            _require(getattr(self, name) >= 0, f"train.{name} must be >= 0, got {getattr(self, name)}")
        _require(0.0 < self.cooldown <= 1.0, f"train.cooldown must be in (0, 1], got {self.cooldown}")
        _require(0.0 <= self.rdrop_from < 1.0, f"train.rdrop_from must be in [0, 1), got {self.rdrop_from}")
        _require(not self.rdrop_from or self.max_minutes or self.max_steps or self.max_epochs,
                 "train.rdrop_from is a fraction of the budget; set train.max_minutes, "
                 "train.max_steps or train.max_epochs")
        _require(self.rdrop or not (self.rdrop_from or self.rdrop_from_epoch),
                 "train.rdrop_from and train.rdrop_from_epoch only choose when R-Drop starts; "
                 "set train.rdrop > 0 to use it")
        _require(0.0 <= self.ema_decay < 1.0, f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        _require(self.schedule not in ("linear", "wsd") or self.max_minutes or self.max_steps
                 or self.max_epochs,
                 f"train.schedule: {self.schedule} decays over the budget; set train.max_minutes, "
                 "train.max_steps or train.max_epochs")


@dataclass(frozen=True)
class DecodeConfig:
    beam: int = 5
    alpha: float = 0.6                # GNMT length penalty exponent; 0 = raw log-probability
    max_len_a: float = 1.5            # max output length = a * source length + b
    max_len_b: int = 10
    min_len: int = 0
    n_best: int = 1
    batch_tokens: int = 6000          # source tokens per translation batch

    def __post_init__(self):
        _require(self.beam >= 1, f"decode.beam must be positive, got {self.beam}")
        _require(1 <= self.n_best <= self.beam,
                 f"decode.n_best must be between 1 and decode.beam ({self.beam}), got {self.n_best}")
        _require(self.alpha >= 0, f"decode.alpha must be >= 0, got {self.alpha}")
        _require(self.batch_tokens >= 1, f"decode.batch_tokens must be positive, got {self.batch_tokens}")


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self):
        _require(not self.train.ffn_dropout_from_epoch
                 or (self.model.arch == "transformer" and self.model.ffn_dropout),
                 "train.ffn_dropout_from_epoch only chooses when the Transformer's FFN dropout "
                 "starts; set model.ffn_dropout > 0 to use it")
        _require(self.data.synthetic_until == 1 or self.train.max_minutes or self.train.max_steps
                 or self.train.max_epochs,
                 "data.synthetic_until is a fraction of the training budget; set train.max_minutes, "
                 "train.max_steps or train.max_epochs")

    def to_dict(self) -> dict:
        """Plain nested dict (tuples as lists), ready for YAML."""
        return yaml.safe_load(yaml.safe_dump(_plain(dataclasses.asdict(self))))


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _plain(value):
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _coerce(section: str, name: str, annotation, value):
    """Check ``value`` against a field's type; ints are accepted where floats are expected."""
    where = f"{section}.{name}"
    expected = annotation if isinstance(annotation, type) else None
    if typing.get_origin(annotation) is tuple:
        items = typing.get_args(annotation)
        any_length = items[-1] is Ellipsis
        shape = "a list" if any_length else f"a list of {len(items)} numbers"
        _require(isinstance(value, (list, tuple)), f"{where} must be {shape}, got {value!r}")
        _require(None not in value, f"{where} has an empty item (YAML reads a blank item as null), "
                                    f"got {list(value)!r}; remove it or write the value")
        if any_length:
            return tuple(_coerce(section, name, items[0], item) for item in value)
        _require(len(value) == len(items), f"{where} must be {shape}, got {value!r}")
        return tuple(_coerce(section, name, item_type, item) for item_type, item in zip(items, value))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is not None and (not isinstance(value, expected)
                                 or (expected is int and isinstance(value, bool))):
        if expected is str and value is None:
            raise UserError(f"{where} must be str, got an empty value (YAML reads it as null); write '' "
                            f"for the empty string, on the command line --set \"{where}=''\"")
        raise UserError(f"{where} must be {expected.__name__}, got {value!r}")
    return value


def section_from_dict(cls, mapping: dict | None, section: str):
    """Build one section's dataclass, rejecting unknown keys and values of the wrong type."""
    mapping = mapping or {}
    _require(isinstance(mapping, dict), f"section '{section}' must be a mapping, got {mapping!r}")
    types_by_name = typing.get_type_hints(cls)
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in mapping if key not in types_by_name]
    if unknown:
        raise UserError(f"unknown config key '{section}.{unknown[0]}'; allowed keys in '{section}': "
                        f"{', '.join(allowed)}")
    values = {key: _coerce(section, key, types_by_name[key], value) for key, value in mapping.items()}
    return cls(**values)


def config_from_dict(raw: dict) -> Config:
    _require(isinstance(raw, dict), "the config file must be a YAML mapping with sections "
                                    f"{', '.join(SECTIONS)}")
    unknown = [key for key in raw if key not in SECTIONS]
    if unknown:
        raise UserError(f"unknown config section '{unknown[0]}'; allowed: {', '.join(SECTIONS)}")
    sections = {name: section_from_dict(typing.get_type_hints(Config)[name], raw.get(name), name)
                for name in SECTIONS}
    return Config(**sections)


def apply_overrides(raw: dict, overrides) -> dict:
    """Apply ``section.key=value`` strings to a raw config dict (values parsed as YAML)."""
    raw = {name: dict(section or {}) for name, section in raw.items()}
    for override in overrides:
        key, sep, text = override.partition("=")
        section, dot, name = key.strip().partition(".")
        _require(bool(sep) and bool(dot) and bool(name),
                 f"override {override!r} must look like section.key=value")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        raw.setdefault(section, {})[name] = value
    return raw


def load_config(path, overrides=()) -> Config:
    """Read a YAML config file (plus ``section.key=value`` overrides) into a :class:`Config`."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    _require(isinstance(raw, dict), f"{path} must hold a YAML mapping with sections "
                                    f"{', '.join(SECTIONS)}")
    return config_from_dict(apply_overrides(raw, overrides))


def save_config(config: Config, path) -> None:
    """Write ``config`` as YAML, atomically: a reader sees the old file or the new one."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.partial")
    temporary.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")
    temporary.replace(path)
