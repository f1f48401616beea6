"""benchmarks/gpu_teachers.sh's control flow, with a stand-in for `python -m attnmt`.

The script trains, scores and translates with attnmt on a GPU for minutes; here every
attnmt call is answered at once by a small bash script, so what is checked is the script's
own work: which directions it runs, which teachers it chooses on val, how it packs the
translations, and what it says when an input or every teacher is missing.
"""
import gzip
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_teachers.sh"

# Validation BLEU of each teacher and of the ensembles of the best k: the best 3 win.
STAND_IN = r"""#!/bin/bash
[ "$1" = -c ] && { echo stand-in; exit 0; }
command=$3; shift 3
case $command in
  train)
    while [ $# -gt 0 ]; do [ "$1" = --run ] && run=$2; shift; done
    [ -n "${NO_TEACHER:-}" ] && exit 1
    mkdir -p $run && touch $run/best.safetensors $run/config.yaml $run/log.csv ;;
  evaluate)
    runs=(); while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do runs+=($(basename $1)); shift; done
    declare -A single=([preset]=40.1 [big1]=38.2 [big2]=39.3 [mid]=39.9)
    case ${#runs[@]} in 1) echo "BLEU ${single[${runs[0]}]}" ;; 2) echo "BLEU 40.5" ;;
                        3) echo "BLEU 40.8" ;; 4) echo "BLEU 40.6" ;; esac ;;
  synthesize)  # one line fewer on the target side, as a synthesis killed between the two writes
    while [ $# -gt 0 ]; do [ "$1" = -i ] && input=$2; [ "$1" = -o ] && out=$2; shift; done
    name=$(basename $out); s=${name%%_*}; rest=${name#*_}; t=${rest%%_*}
    zcat -f $input > $out.$s; zcat -f $input | head -n -1 > $out.$t ;;
esac
"""


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(f"{line}\n" for line in lines))


@pytest.fixture
def inputs(tmp_path):
    """IN as the script's head describes it, with a few lines per file, and the stand-in."""
    gpu_in = tmp_path / "in"
    for lang in ("de", "en"):
        write_gz(gpu_in / "data" / f"train.{lang}.gz", [f"train {lang} {i}" for i in range(6)])
        write_gz(gpu_in / "data" / f"val.{lang}.gz", [f"val {lang} {i}" for i in range(3)])
        write_gz(gpu_in / "mono" / f"mono.{lang}.gz", [f"mono {lang} {i}" for i in range(4)])
    for direction in ("en_de", "de_en"):
        (gpu_in / f"vocab_{direction}").mkdir()
        (gpu_in / f"vocab_{direction}" / "config.yaml").write_text("{}\n")
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    return tmp_path


def run_script(tmp_path, **env):
    environment = {**os.environ, "IN": str(tmp_path / "in"), "OUT": str(tmp_path / "out"),
                   "WORK": str(tmp_path / "work"), "PYTHON": str(tmp_path / "python"),
                   "DEV": "cpu", **env}
    return subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True,
                          text=True, timeout=120)


def tar_members(path):
    with tarfile.open(path) as tar:
        return {member.name: tar.extractfile(member).read().decode()
                for member in tar.getmembers() if member.isfile()}


def test_both_directions_choose_on_val_and_pack_whole_pairs(inputs):
    result = run_script(inputs)
    assert result.returncode == 0, result.stderr
    logs = tar_members(inputs / "out" / "logs.tar.gz")
    for direction in ("en_de", "de_en"):
        chosen = [Path(run).name for run in logs[f"logs/{direction}/chosen.txt"].split()]
        assert chosen == ["preset", "mid", "big2"]
        pairs = tar_members(inputs / "out" / "syn" / f"{direction}_train.tar.gz")
        s, t = direction.split("_")
        assert pairs[f"{direction}_train.cut.{s}"].splitlines() == [f"train {s} {i}" for i in range(5)]
        assert len(pairs[f"{direction}_train.cut.{t}"].splitlines()) == 5
    assert "en_de_train: 5 pairs" in logs["logs/synthetic.txt"]
    assert "de_en_mono: 3 pairs" in logs["logs/synthetic.txt"]


def test_one_direction_alone(inputs):
    result = run_script(inputs, PAIRS="en-de")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (inputs / "out" / "syn").iterdir()) == [
        "en_de_mono.tar.gz", "en_de_train.tar.gz"]
    assert not (inputs / "work" / "de_en").exists()


def test_first_lines_of_val_for_a_dry_run(inputs):
    result = run_script(inputs, VAL="2")
    assert result.returncode == 0, result.stderr
    assert (inputs / "work" / "val.en.2").read_text() == "val en 0\nval en 1\n"


def test_a_missing_input_is_named_before_any_training(inputs):
    (inputs / "in" / "mono" / "mono.en.gz").unlink()
    result = run_script(inputs, PAIRS="de-en en-de")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"gpu_teachers.sh: {inputs / 'in' / 'mono' / 'mono.en.gz'} not found "
        f"(IN={inputs / 'in'}; the head of this script says what IN holds)"]
    assert not (inputs / "work").exists()


def test_no_teacher_trained_says_so_and_fails(inputs):
    result = run_script(inputs, NO_TEACHER="1")
    assert result.returncode == 1
    assert "gpu_teachers.sh: no en->de teacher was scored" in result.stderr
    assert "gpu_teachers.sh: no de->en teacher was scored" in result.stderr
    assert "Traceback" not in result.stderr and "unbound variable" not in result.stderr
    with tarfile.open(inputs / "out" / "logs.tar.gz") as tar:
        assert not any("*" in name for name in tar.getnames())
