"""`opsctl tls ca|rotate -f SPEC`: the CA clients trust, and certificates renewed without restarts."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from opsctl.base.errors import EXIT_OK, OpsctlError
from opsctl.cli.options import add_auto_approve, add_dry_run, add_force_lock, add_spec_options

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.spec.load import LoadedSpec


def _ca(args: argparse.Namespace) -> int:
    from opsctl.cli.output import print_result
    from opsctl.cli.results import TlsCaResult
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.tls.material import ca_text

    loaded = read_spec(args.file)
    if not loaded.spec.tls.enabled:
        raise OpsctlError(f"{loaded.file} has no TLS", hint="set tls.enabled: true (and tls.generate: true)")
    pem = ca_text(loaded, state_dir_for(loaded, args.state_dir))
    if args.output == "json":
        print_result(TlsCaResult(pem), "json")
    else:
        sys.stdout.write(pem)  # the PEM as it is, for `> ca.pem`
    return EXIT_OK


def _deployed_names(loaded: LoadedSpec, state_dir: Path) -> list[str]:
    """The nodes deployed, by the names their records give them (a fresh deploy's names differ after a change of
    shape), drained ones still running included, the ones the next apply adds not; read, not written. Nothing
    deployed there (a mistyped --state-dir): an error, not a list of nodes that do not run."""
    from opsctl.runtime.opening import nothing_deployed, recorded_placement
    from opsctl.spec.deployed import running_nodes

    placed, records = recorded_placement(loaded, state_dir)
    if not records and loaded.spec.topology != "standalone":
        raise OpsctlError(f"{nothing_deployed(loaded, state_dir)}: there is no certificate to rotate",
                          hint="check --state-dir, or run `opsctl apply -f SPEC` first")
    return [n.name for n in running_nodes(placed.layout, records)]


def _rotate(args: argparse.Namespace) -> int:
    from opsctl.apply.tls_rotation import Mode, rotate
    from opsctl.cli.options import confirm
    from opsctl.cli.output import Printer, print_result, printing
    from opsctl.cli.results import LinesResult
    from opsctl.net.topolock import topology_lock
    from opsctl.runtime.opening import make_runtime
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.specfile import read_spec
    from opsctl.state.statelock import state_lock

    loaded = read_spec(args.file)
    if not loaded.spec.tls.enabled:  # said before the dry run too: it must not promise what the run refuses
        raise OpsctlError("the spec has no TLS to rotate", hint="set tls.enabled: true and apply first")
    mode: Mode = "new-ca" if args.new_ca else "drop-old-ca" if args.drop_old_ca else "certs"
    names = _deployed_names(loaded, state_dir_for(loaded, args.state_dir))
    nodes = ", ".join(names)
    if args.dry_run:
        line = f"dry run: would rotate ({mode}) the certificates of {nodes}; nothing changed"
        print_result(LinesResult((line,), (("mode", mode), ("dry_run", True), ("nodes", names))), args.output)
        return EXIT_OK
    confirm(args, f"Rotate ({mode}) the certificates of {nodes}? Clients that do not trust the new files are cut off.")
    rt = make_runtime(loaded, args.state_dir)
    try:
        # one run per topology, whatever its state dir; each node's line as it is done (as text on stdout, as JSON
        # an event on stderr)
        json_mode = args.output == "json"
        with state_lock(rt.state_dir), topology_lock(rt.connector, force=args.force_lock, emit=Printer(json_mode)), \
                printing(json_mode, None if json_mode else sys.stdout) as emit:
            lines = rotate(rt, mode, emit)
    finally:
        rt.close()
    done = (f"rotated: {len(lines)} node(s), no server restarted"
            if not rt.loaded.layout.sentinels else f"rotated: {len(lines)} node(s)")
    if json_mode:
        facts = (("mode", mode), ("dry_run", False), ("nodes", names), ("rotated", len(lines)))
        print_result(LinesResult((*lines, done), facts), "json")
    else:
        print(done)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("tls", help="TLS certificates: the CA to trust, live rotation")
    actions = group.add_subparsers(dest="tls_action", required=True, metavar="ACTION")
    p = actions.add_parser("ca", help="print the CA certificate(s) clients must trust (PEM)")
    add_spec_options(p, output=True)
    p.set_defaults(handler=_ca)
    p = actions.add_parser("rotate", help="new certificate files on every node, reloaded live (same pids)")
    add_spec_options(p, output=True)
    step = p.add_mutually_exclusive_group()
    step.add_argument("--new-ca", action="store_true",
                      help="generated CA: make a new CA and trust it next to the old one (step 1 of 3)")
    step.add_argument("--drop-old-ca", action="store_true",
                      help="generated CA: trust only the newest CA (step 3, after a plain rotate)")
    add_dry_run(p, "name the nodes and the step; change nothing")
    add_auto_approve(p, "do not ask before rotating")
    add_force_lock(p)
    p.set_defaults(handler=_rotate)
