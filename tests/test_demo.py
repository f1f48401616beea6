import attnmt.demo
from attnmt.config import config_from_dict
from attnmt.data.datasets import load_split
from attnmt.translator import Translator


def test_demo_reports_the_accuracy_it_measured(tmp_path, monkeypatch, capsys):
    small = {**attnmt.demo.DEMO_CONFIG,
             "data": {**attnmt.demo.DEMO_CONFIG["data"], "numbers_train": 300, "numbers_test": 40,
                      "numbers_valid": 20},
             "train": {**attnmt.demo.DEMO_CONFIG["train"], "max_steps": 60, "validate_every": 60}}
    monkeypatch.setattr(attnmt.demo, "DEMO_CONFIG", small)
    accuracy = attnmt.demo.run_demo(tmp_path / "demo")
    output = capsys.readouterr().out
    # the accuracy the demo prints is the exact-match rate of its run on its own test split
    test = load_split(config_from_dict(small).data, "test")
    outputs = [t.best.text for t in Translator.from_run(tmp_path / "demo").translate(test.source)]
    correct = sum(output == reference for output, reference in zip(outputs, test.target))
    assert accuracy == correct / 40
    assert f"exact match on 40 held-out numbers: {accuracy:.1%} ({correct} correct)" in output
    assert "vierundzwanzig  ->" in output
    assert (tmp_path / "demo" / "attention_vierundzwanzig.png").read_bytes()[:4] == b"\x89PNG"
