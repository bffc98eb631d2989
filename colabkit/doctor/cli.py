"""`colabkit doctor`: the parser and the command; the checks live in checks.py."""
from __future__ import annotations

import json

DESCRIPTION = """\
Check this GPU box the way a support engineer would: driver, CUDA and framework versions agree; PyTorch and
TensorFlow see every GPU in PCI order; PCIe link width and generation; persistence mode; power limits;
peer-to-peer and an NCCL all-reduce across the GPUs; ECC errors and retired pages; the idle temperature.
Each finding is one line: status, what was found, the fix. Exit status 1 when something fails, else 0.
Not checked: DCGM-level diagnostics (memory and stress tests); run `dcgmi diag -r 3` for those."""


def add_parser(sub) -> None:
    import argparse
    p = sub.add_parser("doctor", help="health check of this GPU box: versions, PCIe, P2P/NCCL, ECC, power, heat",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {check, status, gpu?, found, fix} (with --cluster: one per node)")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="check every node of a Ray cluster: ray://HOST:10001, HOST:6379 or auto")
    p.add_argument("--nccl-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="an all-reduce not done in this time counts as hung (default 60)")
    p.add_argument("--skip", action="append", default=[], metavar="CHECK",
                   help="leave a check out (repeatable), e.g. --skip nccl for a quick look")
    p.set_defaults(func=run)


def run(args) -> int:
    from .findings import exit_code, render_json, render_text
    if args.nccl_timeout <= 0:
        raise ValueError(f"--nccl-timeout {args.nccl_timeout:g}: expected a number of seconds above 0, e.g. 60")
    options = {"nccl_timeout": args.nccl_timeout, "skip": tuple(args.skip)}
    if args.cluster:
        from .cluster import run_on_cluster
        reports = run_on_cluster(args.cluster, **options)
        if args.json:
            print(json.dumps([{"node": label, "findings": [f.as_dict() for f in fs]} for label, fs in reports],
                             indent=1))
        else:
            print("\n\n".join(render_text(fs, title=f"== {label}") for label, fs in reports))
        return max([exit_code(fs) for _, fs in reports] + [0])
    from .checks import run_checks
    findings = run_checks(**options)
    print(render_json(findings) if args.json else render_text(findings))
    return exit_code(findings)
