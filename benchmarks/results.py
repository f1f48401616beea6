"""The results files of records/results/, and the tables the documents generate from them.

    python benchmarks/results.py            # check every file, rewrite the generated tables
    python benchmarks/results.py --check    # exit 1 naming a file or a table that is wrong

Every ``records/results/*.json`` file is one scored model in one schema (``KEYS``), the
one ``benchmarks/quality.py`` writes: what the model is and its direction, the config
and overrides it was trained with, its training figures (``training``, None for an
ensemble), the beam it was scored with, its scores on each test set (``test_sets``:
sacreBLEU BLEU, chrF and lowercased figures with the signature), and what the figures
depend on (``provenance``: the machine as what it is, precision, threads, seed, commit,
date, the resolved config; ``inferred`` names those read from the file's name or the
document that quoted it rather than recorded when it ran, and a null is a fact not kept).
Figures only one experiment has live under ``extra``.

A document shows a table of them with a block whose first line names the files (without
``.json``; ``NAME@MARK`` appends a footnote mark to the row's first cell; ``NAME,NAME2``
makes one row of several runs, seeds say: the first run names the model, the figures of
each are joined with " / "; ``NAME:LANG`` is a multilingual model's pair into or from
LANG, scored in ``extra.other_targets`` or ``extra.other_sources``) and the
columns (``COLUMNS``; ``2016_opus`` and its kin give a test set's BLEU with the OPUS-MT
figure in brackets)::

    <!-- results: transformer_de_en_wsd_cpu_c transformer_en_de_wsd_cpu_c | what machine 2016 2017 -->
    ...the generated table...
    <!-- end results -->

The rows between the two lines are generated; the test suite renders every block and
compares, so a figure is written once, in its file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "records" / "results"

KEYS = {"what": str, "direction": str, "config": (str, type(None)), "overrides": list,
        "parameters": (int, type(None)), "beam": (int, type(None)), "training": (dict, type(None)),
        "test_sets": dict, "provenance": dict}
OPTIONAL_KEYS = {"notes": str, "extra": dict}
TRAINING_KEYS = {"minutes": (int, float), "wall_minutes": (int, float, type(None)), "updates": int,
                 "tokens_per_s": (int, float, type(None)), "valid_bleu_last": (int, float, type(None)),
                 "valid_bleu_best": (int, float, type(None)), "valid_curve": (list, type(None))}
PROVENANCE_KEYS = {"machine": str, "precision": (str, type(None)), "threads": (int, type(None)),
                   "seed": (int, type(None)), "commit": (str, type(None)), "date": (str, type(None)),
                   "config": (dict, type(None)), "inferred": list}
SCORE_KEYS = {"bleu": (int, float), "chrf": (int, float, type(None)), "bleu_lc": (int, float, type(None)),
              "chrf_lc": (int, float, type(None)), "signature": (str, type(None))}
OPTIONAL_SCORE_KEYS = {"ter": (int, float), "sentences": int, "bleu_tok_lc": (int, float)}
# A multilingual model's other pair (extra.other_targets.LANG, extra.other_sources.LANG).
OTHER_PAIR_KEYS = {"valid_bleu_beam5": (int, float), "test_sets": dict}
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
# The best public OPUS-MT model of each direction on each Multi30k test set (BLEU), from the
# Helsinki-NLP OPUS-MT leaderboard; Czech has test_2016_flickr only.
OPUS_MT = {"de-en": {"test_2016_flickr": 40.5, "test_2017_flickr": 41.5, "test_2017_mscoco": 33.9},
           "en-de": {"test_2016_flickr": 36.3, "test_2017_flickr": 35.8, "test_2017_mscoco": 30.6},
           "fr-en": {"test_2016_flickr": 49.7, "test_2017_flickr": 52.0, "test_2017_mscoco": 50.6},
           "en-fr": {"test_2016_flickr": 52.4, "test_2017_flickr": 52.8, "test_2017_mscoco": 54.7},
           "cs-en": {"test_2016_flickr": 38.6},
           "en-cs": {"test_2016_flickr": 33.4}}
# Published constrained Multi30k systems, BLEU on lowercased Moses-tokenised text (the
# dataset's *.lc.norm.tok files, multi-bleu), by direction: (system, {test set: BLEU}, source).
PUBLISHED = {
    "en-de": [("LIUM-CVC WMT17, text-only NMT", {"test_2016_flickr": 39.00, "test_2017_flickr": 31.25},
               "github.com/lium-lst/wmt17-mmt (README)"),
              ("Wu et al. 2021, text-only Transformer-tiny", {"test_2016_flickr": 41.02},
               "github.com/LividWo/Revisit-MMT (README-baseline.md)"),
              ("Wu et al. 2021, gated fusion (multimodal)", {"test_2016_flickr": 41.96},
               "github.com/LividWo/Revisit-MMT (README-gated.md)")],
    "en-fr": [("LIUM-CVC WMT17, text-only NMT", {"test_2016_flickr": 59.02, "test_2017_flickr": 51.93},
               "github.com/lium-lst/wmt17-mmt (README)")],
}
DIRECTION = re.compile(r"^[a-z]{2,3}(\+[a-z]{2,3})*-[a-z]{2,3}(\+[a-z]{2,3})*$")
# A path of the machine a run ran on; a record names folders as the documents' commands do
# (DATA, TED, runs/NAME).
MACHINE_PATH = re.compile(r"(?:^|[\s\[=,])(/(?:tmp|work|home|root|mnt|opt|srv|Users)/[^\s\],]*)")


def schema_errors(record: dict) -> list[str]:
    """What is wrong with one results record; empty when it follows the schema."""
    errors = _check_keys(record, KEYS, OPTIONAL_KEYS, "")
    if isinstance(record.get("training"), dict):
        errors += _check_keys(record["training"], TRAINING_KEYS, {}, "training.")
    if isinstance(record.get("provenance"), dict):
        errors += _check_keys(record["provenance"], PROVENANCE_KEYS, {}, "provenance.")
        errors += [f"provenance.inferred names {name!r}, not a provenance key"
                   for name in record["provenance"].get("inferred", []) if name not in PROVENANCE_KEYS]
    errors += _test_set_errors(record.get("test_sets", {}), SCORE_KEYS, "test_sets.")
    extra = record.get("extra") if isinstance(record.get("extra"), dict) else {}
    for side in ("other_targets", "other_sources"):
        for language, pair in extra.get(side, {}).items():
            prefix = f"extra.{side}.{language}."
            if not isinstance(pair, dict):
                errors.append(f"{prefix[:-1]} is not an object")
                continue
            errors += _check_keys(pair, OTHER_PAIR_KEYS, {"command": str}, prefix)
            if isinstance(pair.get("test_sets"), dict):
                errors += _test_set_errors(pair["test_sets"], {"bleu": (int, float)}, f"{prefix}test_sets.")
    if isinstance(record.get("direction"), str) and not DIRECTION.match(record["direction"]):
        errors.append(f"direction {record['direction']!r} is not like 'de-en' or 'de+fr+cs-en'")
    errors += [f"names {path}, a path of the machine it ran on; write DATA, TED or runs/NAME"
               for path in dict.fromkeys(_machine_paths(record))]
    return errors


def _test_set_errors(test_sets: dict, required: dict, prefix: str) -> list[str]:
    errors = []
    for name, scores in test_sets.items():
        if isinstance(scores, dict):
            errors += _check_keys(scores, required, {**SCORE_KEYS, **OPTIONAL_SCORE_KEYS}, f"{prefix}{name}.")
        else:
            errors.append(f"{prefix}{name} is not an object")
    return errors


def _machine_paths(value) -> list[str]:
    if isinstance(value, dict):
        return [path for item in (*value, *value.values()) for path in _machine_paths(item)]   # keys too
    if isinstance(value, list):
        return [path for item in value for path in _machine_paths(item)]
    return MACHINE_PATH.findall(value) if isinstance(value, str) else []


def file_errors(path: Path) -> list[str]:
    """What is wrong with one results file, unreadable JSON included."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return [f"not a readable JSON file ({error})"]
    return schema_errors(record) if isinstance(record, dict) else ["not a JSON object"]


def _check_keys(values: dict, required: dict, optional: dict, prefix: str) -> list[str]:
    errors = [f"{prefix}{key} is missing" for key in required if key not in values]
    for key, value in values.items():
        kind = required.get(key, optional.get(key))
        if kind is None:
            errors.append(f"{prefix}{key} is not a key of the schema")
        elif not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            errors.append(f"{prefix}{key} has the wrong type ({type(value).__name__})")
    return errors


def load(name: str, results: Path = RESULTS) -> dict:
    path = results / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"results.py: a table names {name}, but {path} does not exist")
    return json.loads(path.read_text(encoding="utf-8"))


def language_pair(record: dict, language: str) -> dict:
    """A multilingual model's record as its pair into (one-to-many) or from (many-to-one)
    ``language``: the pair it trained on keeps its figures; another pair has the
    ``test_sets`` and beam-5 validation BLEU of ``extra.other_targets`` or
    ``extra.other_sources``, and no training figures (they are the first pair's)."""
    sources, targets = (side.split("+") for side in record["direction"].split("-"))
    if language in (sources[0], targets[0]):
        return {**record, "direction": f"{sources[0]}-{targets[0]}"}
    extra = record.get("extra", {})
    if language in extra.get("other_targets", {}):
        direction, scores = f"{sources[0]}-{language}", extra["other_targets"][language]
    elif language in extra.get("other_sources", {}):
        direction, scores = f"{language}-{targets[0]}", extra["other_sources"][language]
    else:
        raise SystemExit(f"results.py: {record['direction']} has no pair scored into or from {language}")
    return {**record, "direction": direction, "training": None,
            "test_sets": scores["test_sets"],
            "extra": {"valid_bleu_beam5": scores["valid_bleu_beam5"]}}


def _bleu(test_set: str, key: str = "bleu"):
    def cell(record: dict, name: str) -> str:
        value = record["test_sets"].get(test_set, {}).get(key)
        return "" if value is None else f"{value:.2f}"
    return cell


def _score(key: str):
    def cell(record: dict, name: str) -> str:
        value = record["test_sets"].get("test_2016_flickr", {}).get(key)
        return "" if value is None else f"{value:.2f}"
    return cell


def _serves(record: dict, name: str) -> str:
    """Whether the deployment install (CTranslate2, no PyTorch) serves the model: a shipped
    model by its name, a single model once exported, an ensemble not at all."""
    export = record.get("extra", {}).get("export", "")
    if export.startswith("models/"):
        return f"shipped: `{Path(export).name}`"
    if record.get("extra", {}).get("runs") and record["parameters"] is None:
        return "no: an ensemble needs PyTorch"
    return "once exported"


def _beside_published(test_set: str):
    """A column's per-row function: the lowercased tokenised BLEU on ``test_set``, then each
    published system's of the direction in brackets."""
    ours = _bleu(test_set, "bleu_tok_lc")

    def row_cell(records: list[dict]) -> str:
        scores = " / ".join(cell for cell in (ours(record, "") for record in records) if cell)
        published = "; ".join(f"{system} {figures[test_set]:.2f}" for system, figures, _ in
                              PUBLISHED.get(records[0]["direction"], []) if test_set in figures)
        return f"{scores or '–'} ({published})" if published else scores
    return row_cell


def _training(key: str, form: str):
    def cell(record: dict, name: str) -> str:
        value = (record["training"] or {}).get(key)
        return "" if value is None else format(value, form)
    return cell


def _validation(record: dict, name: str) -> str:
    """The best greedy validation BLEU of training; an ensemble's, at beam 5."""
    if record["training"] is not None:
        return _training("valid_bleu_best", ".2f")(record, name)
    value = record.get("extra", {}).get("valid_bleu_beam5")
    return "" if value is None else f"{value:.2f} (beam 5)"


def _extra(key: str):
    def cell(record: dict, name: str) -> str:
        value = record.get("extra", {}).get(key)
        return "" if value is None else f"{value:.2f}"
    return cell


def _provenance(key: str):
    def cell(record: dict, name: str) -> str:
        value = record["provenance"][key]
        return "" if value is None else str(value)
    return cell


def _opus_mt(test_set: str):
    def cell(record: dict, name: str) -> str:
        value = OPUS_MT.get(record["direction"], {}).get(test_set)
        return "" if value is None else f"{value:.1f}"
    return cell


def _beside_opus(test_set: str):
    """A column's per-row function: every run's BLEU on ``test_set``, then OPUS-MT's in
    brackets; "–" for a set the runs were not scored on."""
    bleu = _bleu(test_set)

    def row_cell(records: list[dict]) -> str:
        scores = " / ".join(cell for cell in (bleu(record, "") for record in records) if cell)
        opus = OPUS_MT.get(records[0]["direction"], {}).get(test_set)
        if opus is None:
            return scores
        return f"{scores or '–'} ({opus:.1f})"
    return row_cell


def _arguments(record: dict, name: str) -> str:
    words = " ".join([record["config"] or "", *(f"--set {o}" for o in record["overrides"])]).strip()
    return f"`{words}`" if words else ""


# Column name -> (header, cell of a record).
COLUMNS = {
    "what": ("model", lambda record, name: record["what"]),
    "direction": ("direction", lambda record, name: record["direction"].replace("-", "->")),
    "machine": ("machine", _provenance("machine")),
    "precision": ("precision", _provenance("precision")),
    "threads": ("threads", _provenance("threads")),
    "seed": ("seed", _provenance("seed")),
    "minutes": ("minutes", _training("minutes", "g")),
    "updates": ("updates", _training("updates", ",")),
    "tokens_per_s": ("target tokens/s", _training("tokens_per_s", ",.0f")),
    "valid": ("validation BLEU", _validation),
    "2016": ("test_2016_flickr", _bleu("test_2016_flickr")),
    "2017": ("test_2017_flickr", _bleu("test_2017_flickr")),
    "mscoco": ("test_2017_mscoco", _bleu("test_2017_mscoco")),
    "ted": ("TED test (IWSLT17)", _bleu("iwslt17_test")),
    "2016_tok": ("test_2016_flickr, lc tok", _bleu("test_2016_flickr", "bleu_tok_lc")),
    "2017_tok": ("test_2017_flickr, lc tok", _bleu("test_2017_flickr", "bleu_tok_lc")),
    "mscoco_tok": ("test_2017_mscoco, lc tok", _bleu("test_2017_mscoco", "bleu_tok_lc")),
    "chrf": ("chrF", _score("chrf")),
    "bleu_lc": ("BLEU lc", _score("bleu_lc")),
    "chrf_lc": ("chrF lc", _score("chrf_lc")),
    "valid_beam5": ("validation BLEU, beam 5", _extra("valid_bleu_beam5")),
    "greedy": ("test_2016_flickr, greedy", _extra("test_bleu_greedy")),
    "recipe_hours": ("recipe, hours", _extra("recipe_hours")),
    "recipe_scores": ("the recipe's final scores (int8 export)",
                      lambda record, name: "; ".join(record.get("extra", {}).get("recipe_scores", {}).values())),
    "opus": ("OPUS-MT test_2016_flickr", _opus_mt("test_2016_flickr")),
    "serves": ("deployable", _serves),
    "time_before": ("time before", lambda record, name: record.get("extra", {}).get("time_before", "")),
    "arguments": ("config and overrides", _arguments),
    "file": ("file", lambda record, name: f"[{name}](results/{name}.json)"),
}
# Columns of a run's own figures: a row of several runs lists each run's (where it has one);
# the other columns list each distinct value once.
PER_RUN = {"seed", "minutes", "updates", "tokens_per_s", "valid", "valid_beam5", "greedy", "2016", "2017", "mscoco", "ted",
           "2016_tok", "2017_tok", "mscoco_tok", "chrf", "bleu_lc", "chrf_lc", "arguments", "file"}
# Column name -> (header, cell of a row's records).
ROW_COLUMNS = {"2016_tok_published": ("test_2016_flickr, lc tok (published)",
                                      _beside_published("test_2016_flickr")),
               "2017_tok_published": ("test_2017_flickr, lc tok (published)",
                                      _beside_published("test_2017_flickr")),
               "2016_opus": ("test_2016_flickr (OPUS-MT)", _beside_opus("test_2016_flickr")),
               "2017_opus": ("test_2017_flickr (OPUS-MT)", _beside_opus("test_2017_flickr")),
               "mscoco_opus": ("test_2017_mscoco (OPUS-MT)", _beside_opus("test_2017_mscoco"))}

BLOCK = re.compile(r"(<!-- results: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)(<!-- end results -->)", re.S)


def render_table(entries: list[str], columns: list[str], results: Path = RESULTS) -> str:
    """The Markdown table of the files ``entries`` with ``columns``; ends with a newline.
    ``NAME@MARK`` appends MARK (a footnote's number) to the row's first cell, and
    ``NAME,NAME2`` is one row of two runs."""
    unknown = [column for column in columns if column not in COLUMNS and column not in ROW_COLUMNS]
    if unknown:
        raise SystemExit(f"results.py: no column {unknown[0]!r}; the columns are "
                         f"{', '.join([*COLUMNS, *ROW_COLUMNS])}")
    headers = [(COLUMNS | ROW_COLUMNS)[column][0] for column in columns]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for entry in entries:
        row, _, mark = entry.partition("@")
        names, languages = zip(*(name.partition(":")[::2] for name in row.split(",")))
        records = [language_pair(load(name, results), language) if language else load(name, results)
                   for name, language in zip(names, languages)]
        cells = [_row_cell(column, records, names) for column in columns]
        cells[0] += f" {mark}" if mark else ""
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _row_cell(column: str, records: list[dict], names: list[str]) -> str:
    if column in ROW_COLUMNS:
        return ROW_COLUMNS[column][1](records)
    values = [COLUMNS[column][1](record, name) for record, name in zip(records, names)]
    if column in PER_RUN:
        return " / ".join(value for value in values if value)
    if column == "what":
        return values[0]
    return " / ".join(dict.fromkeys(values))


def render_document(text: str, results: Path = RESULTS) -> str:
    """``text`` with every results block's table generated anew."""
    def block(match: re.Match) -> str:
        names, _, columns = match["spec"].partition("|")
        return match.group(1) + render_table(names.split(), columns.split(), results) + match.group(4)
    return BLOCK.sub(block, text)


def documents() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "records").glob("*.md")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file breaks the schema or a table is out of date")
    args = parser.parse_args()
    problems = [f"{path.name}: {error}" for path in sorted(RESULTS.glob("*.json"))
                for error in file_errors(path)]
    if problems:                                # the tables read these files: not before they are whole
        sys.exit("\n".join(problems))
    for document in documents():
        text = document.read_text(encoding="utf-8")
        rendered = render_document(text)
        if rendered != text and args.check:
            problems.append(f"{document.relative_to(ROOT)}: a generated table is out of date; "
                            "run python benchmarks/results.py")
        elif rendered != text:
            document.write_text(rendered, encoding="utf-8")
            print(f"rewrote the tables of {document.relative_to(ROOT)}")
    if problems:
        sys.exit("\n".join(problems))


if __name__ == "__main__":
    main()
