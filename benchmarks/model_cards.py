"""Write the model card (``models/NAME/README.md``) of each shipped model from its record.

    python benchmarks/model_cards.py NAME=RECORD[,RECORD ...] [NAME=...]

NAME is a folder of ``models/`` (an int8 export, ``attnmt export RUN models/NAME``) and
RECORD its record in ``records/results/`` (written by ``python benchmarks/quality.py CONFIG
--run RUN --export models/NAME``). A model trained in a chain of runs, each from the
previous one's weights (``train.init_from``: its run directory, or the int8 export shipped
before it, by name), names every run's record in training order,
the shipped one last, so that its card gives every command that made it. The card's front
matter (YAML) carries what ``attnmt models`` prints and what ``tests/test_shipped.py``
checks: the summary, the record's scores, the chain, and an example sentence with the
translation each engine gives (CTranslate2 int8, and PyTorch with the weights read back
from int8). Its text says what the model is, how it was trained and on what, its scores
beside OPUS-MT's and the published systems', and the data's terms. Nothing in a card is
typed by hand: change the records, then rerun this.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import OPUS_MT, PUBLISHED, TEST_SETS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"de": "German", "en": "English", "fr": "French", "cs": "Czech"}
EXAMPLES = {"de": "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
            "en": "A man rides a bicycle through the city.",
            "fr": "Un homme fait du vélo dans la ville.",
            "cs": "Muž jede na kole přes město."}
ALPHAS = "0.6 0.8 1.0 1.2 1.4"   # the length penalties each shipped model was chosen among
TERMS = ("The model was trained on Multi30k (Elliott et al. 2016; French: Elliott et al. 2017; "
         "Czech: Barrault et al. 2018), image descriptions from Flickr30k, whose terms allow "
         "non-commercial research and education only: use the model within them. attnmt's "
         "code is MIT-licensed.")


def example(folder: Path, source_lang: str) -> dict:
    """The example sentence and its translation by each engine (CTranslate2's with the
    kernels every card's example is made with: ``CARD_EXAMPLE_ENV``)."""
    from attnmt.process import configure
    from attnmt.shipped import CARD_EXAMPLE_ENV
    from attnmt.translator import Translator

    configure(1)
    sentence = EXAMPLES[source_lang]
    exported = subprocess.run(
        [sys.executable, "-m", "attnmt", "translate", str(folder), "--engine", "ctranslate2",
         "--threads", "1"], input=sentence, text=True, capture_output=True,
        env={**os.environ, **CARD_EXAMPLE_ENV})
    if exported.returncode:
        sys.exit(f"model_cards.py: {folder} does not translate: {exported.stderr.strip()}")
    read_back = Translator.from_run(folder, engine="torch", threads=1).translate([sentence])
    return {"source": sentence, "translation": exported.stdout.strip(),
            "pytorch_translation": read_back[0].best.text}


def front_matter(name: str, chain: dict[str, dict], folder: Path) -> dict:
    record_path, record = list(chain.items())[-1]
    source, target = record["direction"].split("-")
    machine = record["provenance"]["machine"]
    summary = (f"{LANGUAGES[source]} -> {LANGUAGES[target]}, Transformer "
               f"({record['parameters'] / 1e6:.1f}M parameters), int8; {recipe(record)}; Multi30k, "
               f"{'a' if on_one_machine(chain) else 'last trained on a'} {machine}.")
    scores = {test_set: {key: record["test_sets"][test_set][key]
                         for key in ("bleu", "chrf", "bleu_tok_lc")}
              for test_set in TEST_SETS if test_set in record["test_sets"]}
    return {"name": name, "summary": summary, "direction": record["direction"],
            "record": record_path, "chain": list(chain),
            "license": "Multi30k: non-commercial research and education",
            "scores": scores, "opus_mt": OPUS_MT.get(record["direction"], {}),
            "valid_bleu_beam5": record.get("extra", {}).get("valid_bleu_beam5"),
            "example": example(folder, source)}


def score_table(fields: dict) -> str:
    published = PUBLISHED.get(fields["direction"], [])
    rows = ["| test set | BLEU | chrF | BLEU, lowercased Moses-tokenised | OPUS-MT (BLEU) | "
            "published systems (lowercased tokenised BLEU) |", "| --- | --- | --- | --- | --- | --- |"]
    for test_set, score in fields["scores"].items():
        others = "; ".join(f"{system} {figures[test_set]:.2f}" for system, figures, _ in published
                           if test_set in figures) or "none found"
        opus = fields["opus_mt"].get(test_set)
        rows.append(f"| {test_set} | {score['bleu']:.2f} | {score['chrf']:.2f} | "
                    f"{score['bleu_tok_lc']:.2f} | {'' if opus is None else f'{opus:.1f}'} | {others} |")
    sources = "".join(f"\n- {system}: {source}" for system, _, source in published)
    gaps = ", ".join(f"{test_set} {score['bleu'] - fields['opus_mt'][test_set]:+.2f}"
                     for test_set, score in fields["scores"].items() if test_set in fields["opus_mt"])
    return ("\n".join(rows) + f"\n\nAgainst OPUS-MT (cased BLEU): {gaps}."
            + ("\n\nSources of the published figures:" + sources if sources else ""))


def hardware(record: dict) -> str:
    """The machine and precision a record's run trained with."""
    return f"{record['provenance']['machine']}, {record['provenance']['precision']}"


def on_one_machine(chain: dict[str, dict]) -> bool:
    """Whether every run of the chain trained on one machine, in one precision."""
    return len({hardware(step) for step in chain.values()}) == 1


def recipe(record: dict) -> str:
    """How the shipped model was made, as its record says (``what`` less "shipped: ")."""
    return record["what"].removeprefix("shipped: ")


def exported_before(records: list[dict]) -> list[bool]:
    """For each step, whether the next run starts from its int8 export (``models/NAME``, the
    model shipped before) rather than from its run directory."""
    return [following["training"] is not None and Path(
                following["provenance"]["config"]["train"]["init_from"])
            == Path(record.get("extra", {}).get("export", "-"))
            for record, following in zip(records, records[1:])] + [False]


def run_directories(name: str, records: list[dict], exported: list[bool]) -> list[str]:
    """Each step's run directory: the one the next step starts from (a training run's
    ``train.init_from``; for an average, the last of the runs it averages), the last step's
    ``runs/NAME``. A step whose export the next run starts from is named by the chain's
    minutes up to it (``runs/en_fr_165min``)."""
    directories, minutes = [], 0.0
    for record, following, from_export in zip(records, records[1:], exported):
        minutes += (record["training"] or {}).get("minutes", 0)
        if from_export:
            directories.append(f"runs/{name.replace('-', '_')}_{minutes:g}min")
        elif following["training"] is None:
            directories.append(following["extra"]["runs"][-1])
        else:
            directories.append(following["provenance"]["config"]["train"]["init_from"])
    return directories + [f"runs/{name}"]


def training_step(record: dict, run_dir: str, name: str, last: dict, exported: bool) -> str:
    """A run's command (after the commands that made its input, as its record names them)
    and figures; its machine where it differs from the last run's, and,
    where the next run starts from this one's int8 export, the export."""
    training = record["training"]
    overrides = " ".join(f"--set {override}" for override in record["overrides"]
                         if not override.startswith("decode.alpha="))   # a later step's
    where = "" if hardware(record) == hardware(last) else f" on a {hardware(record)},"
    made_by = record.get("extra", {}).get("made_by", [])
    inputs = "".join(f" after `{command}`" for command in made_by)
    return (f"`attnmt train {record['config']} --run-dir {run_dir} {overrides}`{inputs}:{where} "
            f"{training['minutes']:g} minutes, {training['updates']:,} updates "
            f"({training['tokens_per_s']:,} target tokens/s), greedy "
            f"`val` BLEU {training['valid_bleu_best']:.2f} at its end"
            + export_note(run_dir, name, exported))


def export_note(run_dir: str, name: str, exported: bool) -> str:
    """Where the next run starts from this step's int8 export, that export's command."""
    return (f"; its int8 export (`attnmt export {run_dir} models/{name}`) was the model "
            f"shipped before, the next run's start" if exported else "")


def average_step(record: dict, run_dir: str, earlier: list[str], name: str, exported: bool) -> str:
    """An average's command (and its export, as in :func:`export_note`); ``earlier`` are the
    directories of the steps before it."""
    runs = record["extra"]["runs"]
    strangers = [run for run in runs if run not in earlier]
    if strangers:
        sys.exit(f"model_cards.py: an average of the chain averages {', '.join(strangers)}, no run "
                 "of the steps before it; name the chain's records in training order")
    numbers = " and ".join(str(earlier.index(run) + 1) for run in runs)
    return (f"`attnmt average {' '.join(runs)} -o {run_dir}`: the mean of runs {numbers}' weights"
            + export_note(run_dir, name, exported))


def training_steps(name: str, chain: dict[str, dict], alpha: float) -> str:
    """The chain's commands, one numbered line per run (or average of runs), then the length
    penalty's choice and the export; DATA is the Multi30k folder."""
    records = list(chain.values())
    exported = exported_before(records)
    run_dirs = run_directories(name, records, exported)
    last = [record for record in records if record["training"] is not None][-1]
    lines = [f"{number}. " + (average_step(record, run_dir, run_dirs[:number - 1], name, from_export)
                              if record["training"] is None
                              else training_step(record, run_dir, name, last, from_export))
             + f" ([record](../../{path}))."
             for number, (path, record, run_dir, from_export)
             in enumerate(zip(chain, records, run_dirs, exported), start=1)]
    source, target = name.split("-")
    lines.append(f"{len(chain) + 1}. `attnmt evaluate {run_dirs[-1]} --engine ctranslate2 "
                 f"--src DATA/val.{source}.gz --ref DATA/val.{target}.gz --alpha {ALPHAS} "
                 f"--write-alpha`: the length penalty of highest `val` BLEU ({alpha:g}).")
    lines.append(f"{len(chain) + 2}. `attnmt export {run_dirs[-1]} models/{name}` (int8).")
    return "\n".join(lines)


def card(name: str, chain: dict[str, dict], folder: Path) -> str:
    """The card of ``models/NAME``; ``chain`` maps each run's record path to the record, in
    training order, the shipped model's last (a run, or an average of earlier runs)."""
    fields = front_matter(name, chain, folder)
    record_path, record = list(chain.items())[-1]
    source, target = fields["direction"].split("-")
    alpha = record["provenance"]["config"]["decode"]["alpha"]
    trained = [record for record in chain.values() if record["training"] is not None]
    provenance, config = trained[-1]["provenance"], trained[-1]["config"]
    runs = "one run" if len(trained) == 1 else \
        f"{len(trained)} runs, each from the previous one's weights with a fresh schedule"
    records = list(chain.values())
    runs += "".join(f", run {number + 1} from the int8 export of run {number}"
                    for number, from_export in enumerate(exported_before(records), start=1)
                    if from_export)
    runs += "".join(f", then the weights of {len(average['extra']['runs'])} of them averaged"
                    for average in records if average["training"] is None)
    where = "" if on_one_machine(chain) else "the last "
    how = recipe(record)
    size = (folder / "model.bin").stat().st_size / 1e6
    return f"""---
{yaml.safe_dump(fields, allow_unicode=True, sort_keys=False)}---
# {name}: {LANGUAGES[source]} -> {LANGUAGES[target]}

{fields['summary']}

```sh
echo "{fields['example']['source']}" | attnmt translate {name}
# {fields['example']['translation']}
```

(CTranslate2's translation with its AVX2 kernels; on a CPU with AVX-512 VNNI the int8 products
round differently and a sentence can come out in other words.)

## What it is

attnmt's Transformer ({record['parameters']:,} parameters; `{config}`), exported with
`attnmt export` as int8 CTranslate2 weights ({size:.1f} MB `model.bin`) with its SentencePiece
tokenizers: the deployment install (`pip install ./deploy`) translates and serves it without
PyTorch; the full install also loads it into the PyTorch engine (weights read back from int8)
for the attention lab and for `attnmt train CONFIG --init-from {name}`. Beam {record['beam']},
length penalty alpha {alpha:g} (chosen on `val`).

## How it was trained

{how[0].upper() + how[1:]}: {runs}, {where}on a
{provenance['machine']}, {provenance['precision']}, {provenance['threads']} thread(s), seed
{provenance['seed']}, on {provenance['date']}; chosen on `val` (beam 5 BLEU of the export:
{fields['valid_bleu_beam5']}). The shipped model's record: [{record_path}](../../{record_path}).

{training_steps(name, chain, alpha)}

The recipes of
[docs/training.md](../../docs/training.md#6-recipes-more-text-more-models) (back-translation, a second hour, distillation) and
a faster machine make better models of this direction: [docs/results.md](../../docs/results.md).

## Scores

Beam {record['beam']}, alpha {alpha:g}, the int8 export on CTranslate2; BLEU and chrF are cased sacreBLEU
on detokenised text, beside it BLEU in the published systems' convention.

{score_table(fields)}

## Terms

{TERMS}
"""


def main() -> None:
    for argument in sys.argv[1:]:
        name, _, paths = argument.partition("=")
        folder = ROOT / "models" / name
        missing = [path for path in [folder / "model.bin", *map(ROOT.joinpath, paths.split(","))]
                   if not path.is_file()]
        if missing:
            sys.exit(f"{argument}: no such file: {', '.join(map(str, missing))}")
        chain = {path: json.loads((ROOT / path).read_text()) for path in paths.split(",")}
        (folder / "README.md").write_text(card(name, chain, folder), encoding="utf-8")
        print(f"wrote {folder / 'README.md'}")


if __name__ == "__main__":
    main()
