"""The generated references (docs/cli.md, docs/config-reference.md) match the code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_and_config_references_are_those_the_code_generates():
    result = subprocess.run([sys.executable, "benchmarks/reference.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_command_and_config_key_is_in_the_references():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reference import config_reference

    from attnmt.cli import build_parser
    from attnmt.config import Config

    cli = (ROOT / "docs" / "cli.md").read_text()
    commands = build_parser()._subparsers._group_actions[0].choices
    assert all(f"## attnmt {name}\n" in cli for name in commands)
    text = config_reference()
    for section in ("data", "model", "train", "decode"):
        for key in getattr(Config(), section).__dataclass_fields__:
            assert f"| `{section}.{key}` |" in text, (section, key)
