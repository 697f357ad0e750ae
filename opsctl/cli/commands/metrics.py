"""`opsctl metrics targets -f SPEC [--state-dir DIR] [-o FILE | --write-to HOST:PATH]`: the Prometheus file_sd target
groups of the exporters of the nodes that are deployed, where they run (the spec placed from the nodes' records, as
every command places it: opsctl.apply.placing), printed, or written atomically (here, or over SSH on the host where
Prometheus runs) so that Prometheus, which watches the file, never reads half."""

from __future__ import annotations

import argparse
import sys

from opsctl.base.errors import EXIT_OK
from opsctl.cli.options import add_spec_file, add_state_dir


def cmd_targets(args: argparse.Namespace) -> int:
    from opsctl.apply.placing import recorded_placement
    from opsctl.plan.metrics import file_sd_json, target_groups
    from opsctl.state.safefs import check_writable_target, write_private
    from opsctl.state.specfile import read_spec
    from opsctl.state.statedir import state_dir_for

    if args.write_to is not None:
        from opsctl.providers.remote.publish import parse_write_to

        parse_write_to(args.write_to)  # before the spec is read: a malformed target changes nothing
    elif args.out not in (None, "-"):
        check_writable_target(args.out, "--out")  # before the spec is read: a wrong path changes nothing
    loaded = read_spec(args.file, secrets=False)  # the targets need no secret: a Prometheus host holds none
    state_dir = state_dir_for(loaded, args.state_dir)
    placed, records = recorded_placement(loaded, state_dir)
    if not records and loaded.spec.topology != "standalone":  # a mistyped --state-dir must not pass unseen
        where = "on its hosts" if loaded.spec.provider == "ansible" else f"in {state_dir}"
        print(f"note: no node of '{loaded.spec.name}' is deployed {where}: the targets are where the first apply "
              "puts the nodes", file=sys.stderr)
    text = file_sd_json(target_groups(placed.spec, placed.layout, records))
    if args.write_to is not None:
        from opsctl.providers.remote.publish import write_over_ssh

        write_over_ssh(loaded.spec, args.write_to, text.encode())
    elif args.out in (None, "-"):
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
    add_state_dir(p, "where the nodes' records are (default: .opsctl/<name> next to the spec): the targets are the "
                     "nodes deployed, where they run")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--out", metavar="FILE",
                   help="write it to FILE atomically (temp file + rename: Prometheus watches it) instead of stdout")
    where.add_argument("--write-to", metavar="HOST:PATH",
                   help="write it over SSH to PATH on HOST (a host of the spec, or [user@]address), atomically, "
                        "mode 0644: where Prometheus runs")
    p.set_defaults(handler=cmd_targets)
