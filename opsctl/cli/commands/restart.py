"""opsctl restart: a rolling restart, shard by shard: replicas first, then each master after a failover."""

from __future__ import annotations

import argparse

from opsctl.base.errors import EXIT_OK, OpsctlError, echo
from opsctl.cli.commands.lifecycle import approving, opened, print_status, rollout_options, rounds_printer
from opsctl.cli.options import add_spec_options


def node_names(text: str) -> frozenset[str]:
    """argparse type of --nodes: comma-separated node names, none of them empty."""
    names = [word.strip() for word in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{echo(text)} has an empty node name (give NAME[,NAME...])")
    return frozenset(names)


def cmd_restart(args: argparse.Namespace) -> int:
    from opsctl.apply import ApplyOptions, run_plan
    from opsctl.apply.planning import refuse_silent_nodes, spec_digest
    from opsctl.cli.output import printing
    from opsctl.plan.rolling import restart_plan
    from opsctl.runtime.gather import settled_facts
    from opsctl.status import status

    with opened(args, locked=not args.dry_run) as rt, printing(args.output == "json") as printer:
        names = [n.name for n in rt.loaded.layout.nodes]
        selected = set(args.nodes) if args.nodes is not None else set(names)
        unknown = sorted(selected - set(names))
        if unknown:
            raise OpsctlError(f"no node named {', '.join(unknown)}", hint=f"nodes are: {', '.join(names)}")
        facts = settled_facts(rt, with_config=False, emit=printer)
        refuse_silent_nodes(facts, rt.loaded.spec.tls.enabled)
        plan = restart_plan(rt.loaded, facts, selected, spec_digest(rt.loaded))
        question = f"Restart {len(selected)} node(s) of '{plan.spec_name}'?"
        options = ApplyOptions(dry_run=args.dry_run, allow_downtime=args.allow_downtime,
                               parallel_shards=args.parallel_shards, wait_timeout=args.wait_timeout,
                               approve=approving(args, lambda _: question))
        run_plan(rt, plan, options, rounds_printer(printer, done="Restarted"))
        printer.close()  # the bar erased before the status
        if not args.dry_run:
            print_status(status(rt), args.output)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restart", help="rolling restart: replicas first, masters after a graceful failover")
    add_spec_options(p, output=True)
    p.add_argument("--nodes", type=node_names, help="comma-separated node names (default: every node)")
    rollout_options(p, "allow restarting a master that has no replica")
    p.set_defaults(handler=cmd_restart)
