"""The ``attnmt`` command: argument parsing only; the work lives in the modules."""

from __future__ import annotations

import argparse
import sys

from attnmt import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Attention-based sequence-to-sequence learning and neural machine translation.")
    parser.add_argument("--version", action="version", version=f"attnmt {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return 0
