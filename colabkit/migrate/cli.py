"""``colabkit migrate``: the command-line skin over colabkit.migrate.migrate_paths."""
from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = """\
Rewrite Colab notebooks so they run unchanged on Colab and on your own machine: Colab-only calls become
colabkit's portable ones (drive.mount -> colabkit.mount_drive, '/content/drive/MyDrive/x' -> colabkit.drive('x'),
userdata.get -> colabkit.secret, !pip -> %pip, ...); what has no portable equivalent runs only on Colab or is
reported. Training the notebook does not write itself is reported with the colabkit resume that fits it: a
transformers or TRL trainer -> colabkit.hf.AutoResume, an accelerate loop -> colabkit.hf.AccelerateResume,
!accelerate launch train.py ... -> the line run under colabkit guard. Only cell sources change; outputs, metadata
and formatting stay byte for byte. Notebook code is never run. By default NAME.ipynb is written to
NAME.local.ipynb and the original is left alone."""

EPILOG = """\
exit status: 0 done (or nothing to change); 1 with --check: some notebook needs changes;
2 a notebook could not be read or written, or bad arguments.
Rules are chosen by code (CK101), name (drive-mount) or prefix (CK1); see --list-rules.
pre-commit: colabkit migrate --check notebooks/*.ipynb"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "migrate", help="make Colab notebooks run unchanged on Colab and on a home rig",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="notebook files (.ipynb)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT",
                       help="output file (one notebook) or folder (several); default: NAME.local.ipynb")
    where.add_argument("--in-place", action="store_true",
                       help="overwrite each notebook, after copying it to NAME.ipynb.bak")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if some notebook needs changes (CI, pre-commit)")
    p.add_argument("--diff", action="store_true",
                   help="print a unified diff of the changed cell sources; write nothing")
    p.add_argument("--rules", metavar="CODES", help="only these rules, e.g. CK101,CK102 or CK1 (default: all)")
    p.add_argument("--ignore", metavar="CODES", help="skip these rules")
    p.add_argument("--drive-root", metavar="PATH",
                   help="the folder that holds your Drive files on this machine: Drive files the notebook names "
                        "but PATH lacks are reported")
    p.add_argument("--install-from", metavar="URL",
                   help="where the added install cell gets colabkit, as pip takes it after 'colabkit @' "
                        "(e.g. git+https://github.com/ORG/colabkit@v0.1); default: where this colabkit was "
                        "installed from (a git URL and commit), else colabkit>=THIS_VERSION from PyPI")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="one line per notebook")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from .api import migrate_paths
    from .report import summary
    from .rules import rule_table
    if args.list_rules:
        print(rule_table())
        return 0
    if not args.notebooks:
        print("colabkit migrate: error: no notebooks given (or use --list-rules)", file=sys.stderr)
        return 2
    dry = args.check or args.diff
    try:
        reports = migrate_paths(args.notebooks, args.output, in_place=args.in_place, check=dry, rules=args.rules,
                                ignore=args.ignore, drive_root=args.drive_root, force=args.force,
                                install_from=args.install_from)
    except ValueError as exc:
        print(f"colabkit migrate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.as_dict() for r in reports], indent=2))
    else:
        for report in reports:
            if args.diff and report.changed:
                sys.stdout.write(report.diff())
            stream = sys.stderr if report.failed else sys.stdout
            if not (args.diff and not args.check and not report.failed):
                print(report.text(quiet=args.quiet), file=stream)
        if len(reports) > 1 and not args.diff:
            print(summary(reports))
    if any(r.failed for r in reports):
        return 2
    if args.check and any(r.changed for r in reports):
        return 1
    return 0
