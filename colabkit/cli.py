"""The `colabkit` command: thin subcommands over colabkit's Python functions."""
from __future__ import annotations

import argparse
import sys

from ._version import __version__


def _cmd_status(args) -> int:
    from .summary import status
    s = status()
    print(s.json() if args.json else s.text())
    return 0


def _cmd_config(args) -> int:
    from .summary import config_report
    print(config_report())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colabkit",
        description="Crash-safe checkpoints, one-line resume and a session clock for Colab and home GPU rigs.")
    parser.add_argument("--version", action="version", version=f"colabkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("status", help="where we run, VM age, time left to the runtime cap, drive root, GPUs")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("config", help="print the effective settings and where each came from")
    p.set_defaults(func=_cmd_config)

    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from .config import ConfigError
    try:
        return args.func(args)
    except (ConfigError, ValueError, FileNotFoundError, ImportError) as exc:
        print(f"colabkit {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"colabkit {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
