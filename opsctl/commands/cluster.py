"""`opsctl cluster check -f SPEC`: coverage, open slots, agreement; names the node that disagrees."""

from __future__ import annotations

import argparse
import json

from opsctl.commands import REGISTRARS
from opsctl.errors import EXIT_ERROR, EXIT_OK, OpsctlError


def cmd_check(args: argparse.Namespace) -> int:
    from opsctl.cluster.check import report_text, summarize
    from opsctl.observe.collect import observe
    from opsctl.specfile import read_spec

    loaded = read_spec(args.file)
    if loaded.spec.topology != "cluster":
        raise OpsctlError(f"{loaded.file} describes a {loaded.spec.topology} topology, not a cluster",
                          hint="use `opsctl status -f SPEC` for other topologies")
    report = summarize(observe(loaded, loaded.layout.servers, timeout=args.timeout))
    print(json.dumps(report.to_dict(), indent=2) if args.output == "json" else report_text(report))
    return EXIT_OK if report.healthy else EXIT_ERROR


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("cluster", help="inspect a cluster's live state")
    commands = group.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    p = commands.add_parser("check", help="slot coverage, open slots, agreement (exit 1 on problems)")
    p.add_argument("-f", "--file", required=True, help="topology spec (YAML)")
    p.add_argument("--output", choices=("text", "json"), default="text")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for each node")
    p.set_defaults(handler=cmd_check)


REGISTRARS.append(register)
