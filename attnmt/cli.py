"""The ``attnmt`` command: argument parsing only; the work lives in the modules."""

from __future__ import annotations

import argparse
import sys

from attnmt import __version__
from attnmt.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmt",
        description="Attention-based sequence-to-sequence learning and neural machine translation.")
    parser.add_argument("--version", action="version", version=f"attnmt {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser("train", help="train a model, or resume its run directory",
                                description="Train the model a YAML config describes. An existing "
                                            "run directory is resumed exactly.")
    train.add_argument("config", help="YAML config file (see configs/)")
    train.add_argument("--run", help="run directory (default: runs/<config name>)")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config value, e.g. --set train.max_steps=1000")
    train.set_defaults(handler=run_train)
    return parser


def run_train(args) -> int:
    from attnmt.train import train

    run = train(args.config, args.run, args.set)
    print(f"run directory: {run}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.handler(args)
    except UserError as error:
        print(f"attnmt: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("attnmt: interrupted; the last checkpoint is kept and the same command resumes",
              file=sys.stderr)
        return 130
