import pytest

from attnmt.config import Config, DataConfig, ModelConfig, TrainConfig, load_config, save_config
from attnmt.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_loads_sections_and_overrides(tmp_path):
    path = write(tmp_path, "model:\n  arch: rnn\n  hidden_dim: 64\ntrain:\n  lr: 1\n")
    config = load_config(path, ["model.decoder=luong", "train.betas=[0.9, 0.99]",
                                "data.extra_src_langs=[fr]"])
    assert config.model.arch == "rnn" and config.model.hidden_dim == 64
    assert config.model.decoder == "luong"
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float)
    assert config.train.betas == (0.9, 0.99)
    assert config.data.extra_src_langs == ("fr",)


def test_round_trip_through_yaml(tmp_path):
    config = load_config(write(tmp_path, "model:\n  heads: 8\n"))
    save_config(config, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == config


def test_unknown_key_named_with_allowed_ones(tmp_path):
    with pytest.raises(UserError, match=r"unknown config key 'model.head'; allowed keys in 'model': "
                                        r"arch, .*heads"):
        load_config(write(tmp_path, "model:\n  head: 8\n"))


def test_unknown_section(tmp_path):
    with pytest.raises(UserError, match="unknown config section 'modle'"):
        load_config(write(tmp_path, "modle: {}\n"))


@pytest.mark.parametrize("values,message", [
    (dict(heads=3), r"model.heads \(3\) must divide model.d_model \(256\)"),
    (dict(dropout=-0.1), r"model.dropout must be in \[0, 1\), got -0.1"),
    (dict(cell="tree"), "model.cell must be one of rnn, gru, lstm; got 'tree'"),
    (dict(decoder="sutskever"), "model.decoder must be one of none, bahdanau, luong"),
])
def test_impossible_model_values(values, message):
    with pytest.raises(UserError, match=message):
        ModelConfig(**values)


@pytest.mark.parametrize("values,message", [
    (dict(source_word_dropout=1.0), r"train.source_word_dropout must be in \[0, 1\), got 1.0"),
    (dict(label_smoothing=-0.1), r"train.label_smoothing must be in \[0, 1\), got -0.1"),
    (dict(rdrop=-1.0), r"train.rdrop must be >= 0, got -1.0"),
    (dict(rdrop=1.0, rdrop_from=1.0, max_steps=10), r"train.rdrop_from must be in \[0, 1\), got 1.0"),
    (dict(rdrop=1.0, rdrop_from=0.5), "train.rdrop_from is a fraction of the budget; set train.max_minutes"),
    (dict(rdrop=1.0, rdrop_from_epoch=-1), r"train.rdrop_from_epoch must be >= 0, got -1"),
    (dict(rdrop_from=0.5, max_steps=10), "train.rdrop_from and train.rdrop_from_epoch only choose when "
                                         "R-Drop starts; set train.rdrop > 0 to use it"),
    (dict(rdrop_from_epoch=3), "set train.rdrop > 0 to use it"),
    (dict(ffn_dropout_from_epoch=-1), r"train.ffn_dropout_from_epoch must be >= 0, got -1"),
])
def test_impossible_train_values(values, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(**values)


@pytest.mark.parametrize("overrides", [["train.ffn_dropout_from_epoch=3"],
                                       ["train.ffn_dropout_from_epoch=3", "model.ffn_dropout=0.1",
                                        "model.arch=rnn"]])
def test_ffn_dropout_start_needs_a_transformer_ffn_dropout(tmp_path, overrides):
    with pytest.raises(UserError, match="train.ffn_dropout_from_epoch only chooses when the "
                                        "Transformer's FFN dropout starts; set model.ffn_dropout > 0"):
        load_config(write(tmp_path, "{}"), overrides)
    load_config(write(tmp_path, "{}"), ["train.ffn_dropout_from_epoch=3", "model.ffn_dropout=0.1"])


@pytest.mark.parametrize("values,message", [
    (dict(extra_src_langs=("en",)), r"data.extra_src_langs must list languages other than src_lang "
                                    r"and tgt_lang, each once; got \['en'\]"),
    (dict(extra_src_langs=("fr", "fr")), r"each once; got \['fr', 'fr'\]"),
    (dict(extra_src_langs=("fr",), dataset="files", train="pairs.tsv"), r"data.extra_src_langs and extra_tgt_langs need one file per "
                                                       r"language \(pairs.tsv holds one language pair\)"),
    (dict(synthetic=("bt",), synthetic_until=1.5), r"data.synthetic_until must be in \(0, 1\], got 1.5"),
    (dict(synthetic=("bt",), synthetic_until=0.0), r"data.synthetic_until must be in \(0, 1\], got 0.0"),
    (dict(synthetic_until=0.8), "data.synthetic_until needs data.synthetic"),
])
def test_impossible_data_values(values, message):
    with pytest.raises(UserError, match=message):
        DataConfig(**values)


def test_synthetic_until_needs_a_budget(tmp_path):
    ending = ["data.synthetic=[bt]", "data.synthetic_until=0.8"]
    with pytest.raises(UserError, match="data.synthetic_until is a fraction of the training budget; "
                                        "set train.max_minutes"):
        load_config(write(tmp_path, "{}"), ending)
    load_config(write(tmp_path, "{}"), [*ending, "train.max_minutes=60"])


def test_wrong_type_named(tmp_path):
    with pytest.raises(UserError, match="model.heads must be int, got 'four'"):
        load_config(write(tmp_path, "model:\n  heads: four\n"))
    with pytest.raises(UserError, match="data.extra_src_langs must be a list, got 'fr'"):
        load_config(write(tmp_path, "data:\n  extra_src_langs: fr\n"))
    with pytest.raises(UserError, match="data.extra_src_langs must be str, got 3"):
        load_config(write(tmp_path, "data:\n  extra_src_langs: [3]\n"))
    for betas in ("0.9", "[0.9]", "[0.9, 0.98, 0.99]"):
        with pytest.raises(UserError, match=r"train.betas must be a list of 2 numbers, got "):
            load_config(write(tmp_path, "{}"), [f"train.betas={betas}"])


def test_an_empty_string_setting_left_blank_says_how_to_write_it(tmp_path):
    with pytest.raises(UserError, match=r"data.synthetic_tag must be str, got an empty value .*"
                                        r"--set \"data.synthetic_tag=''\""):
        load_config(write(tmp_path, "{}"), ["data.synthetic_tag="])
    assert load_config(write(tmp_path, "{}"), ["data.synthetic_tag=''"]).data.synthetic_tag == ""


def test_a_blank_item_in_a_list_setting_is_named_as_such(tmp_path):
    with pytest.raises(UserError, match=r"data.extra_src_langs has an empty item .*got \['fr', None\]"):
        load_config(write(tmp_path, "data:\n  extra_src_langs:\n    - fr\n    -\n"))
    with pytest.raises(UserError, match=r"train.betas has an empty item .*got \[0.9, None\]"):
        load_config(write(tmp_path, "train:\n  betas:\n    - 0.9\n    -\n"))


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="must look like section.key=value"):
        load_config(write(tmp_path, "{}"), ["heads=4"])
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_invalid_yaml(tmp_path):
    with pytest.raises(UserError, match="is not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed\n"))


def test_numbers_preset_is_the_demo_config():
    from pathlib import Path

    from attnmt.demo import demo_config

    preset = Path(__file__).resolve().parents[1] / "configs" / "numbers_de_en.yaml"
    assert load_config(preset) == demo_config()


def test_configuration_document_lists_every_key_with_its_default():
    from pathlib import Path

    import yaml

    document = (Path(__file__).resolve().parents[1] / "records" / "configuration.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip(" `")
            for line in document.splitlines() if line.startswith("| `")}
    for section, values in Config().to_dict().items():
        for key, default in values.items():
            name = f"{section}.{key}"
            assert name in rows, f"records/configuration.md does not list {name}"
            assert yaml.safe_load(rows[name] or "''") == default, f"{name}: documented {rows[name]!r}"


def test_time_budgeted_presets_schedule_on_the_budget():
    """A preset with a time budget must decay with it (linear or wsd), not count steps:
    a step-based schedule is fitted to one machine's update rate."""
    from pathlib import Path

    presets = sorted((Path(__file__).resolve().parents[1] / "configs").glob("multi30k_*.yaml"))
    assert len(presets) == 4
    for preset in presets:
        train_config = load_config(preset).train
        assert train_config.max_minutes > 0, preset.name
        assert train_config.schedule in ("linear", "wsd"), f"{preset.name}: {train_config.schedule}"


def test_the_example_for_ones_own_files_trains_on_plain_text(tmp_path):
    """configs/own_corpus.yaml, as its comment says to use it: plain files by prefix."""
    from pathlib import Path

    from attnmt.train import train

    words = ["ein", "Hund", "eine", "Katze", "läuft", "schläft", "hier", "dort"]
    english = ["a", "dog", "a", "cat", "runs", "sleeps", "here", "there"]
    lines = [(f"{words[i % 8]} {words[(i * 3) % 8]}", f"{english[i % 8]} {english[(i * 3) % 8]}")
             for i in range(200)]
    data = tmp_path / "my_data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.de").write_text("".join(de + "\n" for de, _ in lines))
        (data / f"{split}.en").write_text("".join(en + "\n" for _, en in lines))
    preset = Path(__file__).resolve().parents[1] / "configs" / "own_corpus.yaml"
    run = train(preset, tmp_path / "mine",
                [f"data.train={data / 'train'}", f"data.valid={data / 'valid'}",
                 "data.vocab_size=40", "train.max_steps=3", "train.validate_every=3",
                 "train.max_minutes=0", "train.threads=1"])
    assert (run / "best.safetensors").is_file()
