"""`opsctl metrics targets -f SPEC [-o FILE]`: the Prometheus file_sd target groups of the spec's exporters
(opsctl.plan.metrics), printed, or written atomically so that Prometheus, which watches the file, never reads half."""

from __future__ import annotations

import argparse

from opsctl.base.errors import EXIT_OK
from opsctl.cli.options import add_spec_file


def cmd_targets(args: argparse.Namespace) -> int:
    from opsctl.plan.metrics import file_sd_json, target_groups
    from opsctl.state.safefs import check_writable_target, write_private
    from opsctl.state.specfile import read_spec

    if args.out not in (None, "-"):
        check_writable_target(args.out, "--out")  # before the spec is read: a wrong path changes nothing
    loaded = read_spec(args.file, secrets=False)  # the targets need no secret: a Prometheus host holds none
    text = file_sd_json(target_groups(loaded.spec, loaded.layout))
    if args.out in (None, "-"):
        print(text, end="")
    else:
        from pathlib import Path

        write_private(Path(args.out), text, mode=0o644)  # Prometheus, another user, reads it; it holds no secret
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("metrics", help="what Prometheus needs to scrape a fleet (docs/monitoring.md)")
    commands = group.add_subparsers(dest="metrics_command", required=True, metavar="SUBCOMMAND")
    p = commands.add_parser("targets", help="print the exporters as Prometheus file_sd JSON, labelled by node")
    add_spec_file(p)
    p.add_argument("-o", "--out", metavar="FILE",
                   help="write it to FILE atomically (temp file + rename: Prometheus watches it) instead of stdout")
    p.set_defaults(handler=cmd_targets)
