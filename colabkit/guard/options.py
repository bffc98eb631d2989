"""What `colabkit guard` and the ``%%guard`` magic share: option values that begin with a dash, and the
keyword arguments of ``run`` from parsed options."""
from __future__ import annotations

__all__ = ["VALUE_OPTIONS", "glue_values", "run_kwargs"]

# options whose value is itself an argument for the script ("--resume_from_checkpoint={latest}"): argparse would
# read such a value as an option of its own
VALUE_OPTIONS = ("--resume-arg", "--fresh-arg")


def glue_values(argv: list[str]) -> list[str]:
    """``["--resume-arg", "--resume_from_checkpoint={latest}"]`` -> ``["--resume-arg=--resume_from_checkpoint=
    {latest}"]``, so that a value starting with a dash reaches its option."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def run_kwargs(args) -> dict:
    """``run``'s keyword arguments from the parsed options (argparse's namespace)."""
    return dict(watch=args.watch, to=args.to, resume_arg=args.resume_arg, fresh_arg=args.fresh_arg,
                patterns=args.pattern or None, markers=args.marker or (), keep=args.keep, every=args.every,
                settle=args.settle, deadline=None if args.deadline in ("off", "none") else args.deadline,
                margin=args.margin, stop_signal=args.stop_signal, grace=args.grace, retries=args.retries)
