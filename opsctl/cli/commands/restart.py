"""opsctl restart: a rolling restart, shard by shard: replicas first, then each master after a failover."""

from __future__ import annotations

import argparse

from opsctl.base.errors import EXIT_OK, OpsctlError, echo
from opsctl.cli.commands.lifecycle import rollout_options, run_plan
from opsctl.cli.options import add_spec_options
from opsctl.cli.runtime import open_runtime, print_status


def node_names(text: str) -> frozenset[str]:
    """argparse type of --nodes: comma-separated node names, none of them empty."""
    names = [word.strip() for word in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{echo(text)} has an empty node name (give NAME[,NAME...])")
    return frozenset(names)


def cmd_restart(args: argparse.Namespace) -> int:
    from opsctl.apply.planning import refuse_silent_nodes, spec_digest
    from opsctl.plan.rolling import restart_plan
    from opsctl.runtime.gather import settled_facts

    with open_runtime(args, locked=not args.dry_run) as rt:
        names = [n.name for n in rt.loaded.layout.nodes]
        selected = set(args.nodes) if args.nodes is not None else set(names)
        unknown = sorted(selected - set(names))
        if unknown:
            raise OpsctlError(f"no node named {', '.join(unknown)}", hint=f"nodes are: {', '.join(names)}")
        facts = settled_facts(rt, with_config=False)
        refuse_silent_nodes(facts, rt.loaded.spec.tls.enabled)
        plan = restart_plan(rt.loaded, facts, selected, spec_digest(rt.loaded))
        run_plan(rt, plan, args, f"Restart {len(selected)} node(s) of '{plan.spec_name}'?", "Restarted")
        if not args.dry_run:
            print_status(rt, args.output)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("restart", help="rolling restart: replicas first, masters after a graceful failover")
    add_spec_options(p, output=True)
    p.add_argument("--nodes", type=node_names, help="comma-separated node names (default: every node)")
    rollout_options(p, "allow restarting a master that has no replica")
    p.set_defaults(handler=cmd_restart)
