"""`opsctl metrics targets -f SPEC [--state-dir DIR] [--out FILE | --write-to HOST:PATH]`: the Prometheus file_sd target
groups of the exporters of the nodes that are deployed, where they run (the spec placed from the nodes' records, as
every command places it: opsctl.runtime.opening), printed, or written atomically (here, or over SSH on the host where
Prometheus runs) so that Prometheus, which watches the file, never reads half.
`opsctl metrics rules --dir DIR [--force]`: the alert rules, their promtool tests and the Grafana dashboard shipped in
the package, written into DIR."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from opsctl.base.errors import EXIT_OK
from opsctl.cli.options import Moved, add_output, add_spec_file, add_state_dir

if TYPE_CHECKING:
    from opsctl.metrics.targets import TargetGroup
    from opsctl.spec.load import LoadedSpec

RULES_HINT = "give --dir an existing folder of yours (mkdir -p DIR first), e.g. /etc/prometheus/opsctl"


def cmd_targets(args: argparse.Namespace) -> int:
    from opsctl.cli.commands.fleetrun import is_folder
    from opsctl.metrics.targets import file_sd_json
    from opsctl.state.safefs import check_writable_target, write_private
    from opsctl.state.specfile import read_spec

    if args.write_to is not None:
        from opsctl.providers.remote.publish import parse_write_to

        parse_write_to(args.write_to)  # before the spec is read: a malformed target changes nothing
    elif args.out not in (None, "-"):
        check_writable_target(args.out, "--out")  # before the spec is read: a wrong path changes nothing
    if is_folder(args):  # one file_sd for the fleet: every topology's exporters, each labelled by its topology
        from opsctl.cli.commands.fleetrun import fleet_of

        fleet = fleet_of(args)
        loaded = fleet.specs[0]
        text = file_sd_json([group for one in fleet.specs for group in _groups(one, None)])
    else:
        loaded = read_spec(args.file, secrets=False)  # the targets need no secret: a Prometheus host holds none
        text = file_sd_json(_groups(loaded, args.state_dir))
    if args.write_to is not None:
        from opsctl.providers.remote.publish import write_over_ssh

        write_over_ssh(loaded.spec, args.write_to, text.encode())
    elif args.out in (None, "-"):
        print(text, end="")
    else:
        write_private(Path(args.out), text, mode=0o644)  # Prometheus, another user, reads it; it holds no secret
    return EXIT_OK


def _groups(loaded: LoadedSpec, state_dir_arg: str | None) -> list[TargetGroup]:
    """The file_sd groups of one topology: its nodes deployed, where they run."""
    from opsctl.cli.output import say
    from opsctl.metrics.targets import target_groups
    from opsctl.runtime.opening import nothing_deployed, recorded_placement
    from opsctl.state.localdirs import state_dir_for

    state_dir = state_dir_for(loaded, state_dir_arg)
    placed, records = recorded_placement(loaded, state_dir)
    _refuse_ports_above_range(placed)  # where the nodes run: a node placed past base_port's range counts too
    if not records and loaded.spec.topology != "standalone":  # a mistyped --state-dir must not pass unseen
        say(f"note: {nothing_deployed(loaded, state_dir)}: the targets are where the first apply puts the nodes", False)
    return target_groups(placed.spec, placed.layout, records)


def _refuse_ports_above_range(loaded: LoadedSpec) -> None:
    """Without metrics.exporter validation leaves the offset alone (the exporters are someone else's), but a target
    past 65535 is no endpoint at all."""
    from opsctl.base.errors import OpsctlError
    from opsctl.spec.layout import exporter_ports_above_range

    above = exporter_ports_above_range(loaded.layout, loaded.spec.metrics.port_offset)
    if above:
        more = f" (and {len(above) - 1} more)" if len(above) > 1 else ""
        raise OpsctlError(f"{loaded.file}: metrics.port_offset: {above[0]}{more}",
                          hint="lower metrics.port_offset (or the ports) so every node's port + the offset is at most "
                               "65535")


class RulesResult(NamedTuple):
    """What metrics rules wrote into folder (names inside it) and which of them it replaced (--force).
    A NamedTuple: this module is imported to build every parser, and dataclasses costs `opsctl --help` its import."""

    folder: str
    files: tuple[str, ...]
    replaced: tuple[str, ...]

    def text(self) -> str:
        replaced = f" ({len(self.replaced)} replaced)" if self.replaced else ""
        return "\n".join([f"wrote {len(self.files)} files to {self.folder}{replaced}: {', '.join(self.files)}",
                          f"  check them:     promtool test rules {self.folder}/tests/*.yml",
                          f"  prometheus.yml: rule_files: [{self.folder}/alerts.yml]",
                          f"  Grafana:        Dashboards > New > Import > {self.folder}/opsctl-redis.json"])

    def to_dict(self) -> dict[str, object]:
        return {"dir": self.folder, "files": list(self.files), "replaced": list(self.replaced)}


def cmd_rules(args: argparse.Namespace) -> int:
    """Every target checked before the first is written: a refused run writes nothing."""
    from opsctl import monitoring_files
    from opsctl.cli.output import print_result
    from opsctl.state.safefs import make_dir, write_private

    folder = Path(args.dir)
    _check_rules_dir(folder)
    files = monitoring_files()
    replaced = _existing_targets(folder, [name for _, name in files], args.force)
    make_dir(folder / "tests", mode=0o755, enforce=False)
    for source, name in files:
        write_private(folder / name, source.read_bytes(), mode=0o644)  # Prometheus and Grafana, other users, read it
    print_result(RulesResult(str(folder), tuple(name for _, name in files), tuple(replaced)), args.output)
    return EXIT_OK


def _check_rules_dir(folder: Path) -> None:
    import os

    from opsctl.state.safefs import FileProblem, check_dir_stat

    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        raise FileProblem(folder, "does not exist", RULES_HINT) from None
    except OSError as exc:
        raise FileProblem(folder, f"cannot be inspected: {exc.strerror}", RULES_HINT) from None
    check_dir_stat(folder, st, None, RULES_HINT, "give --dir the folder it points to (readlink -f DIR): metrics "
                   "rules writes into a real folder only")


def _existing_targets(folder: Path, names: list[str], force: bool) -> list[str]:
    """The names already in folder: refused without force; with it, only regular files (never a link)."""
    import os

    from opsctl.base.errors import OpsctlError
    from opsctl.state.safefs import check_dir_stat, check_file_stat

    existing: list[str] = []
    for name in ["tests", *names]:
        try:
            st = os.lstat(folder / name)
        except FileNotFoundError:
            continue
        if name == "tests":
            check_dir_stat(folder / name, st, None, "move it away: the rule tests go into DIR/tests")
            continue
        check_file_stat(folder / name, st, "move it away, or give another --dir")
        existing.append(name)
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise OpsctlError(f"{folder / existing[0]}{more} {'exist' if more else 'exists'} already: metrics rules "
                          "writes no file over another",
                          hint="give --force to replace them with the shipped ones, or another --dir")
    return existing


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = sub.add_parser("metrics", help="what Prometheus needs to scrape a fleet (docs/monitoring.md)")
    commands = group.add_subparsers(dest="metrics_command", required=True, metavar="SUBCOMMAND")
    p = commands.add_parser("targets", help="print the exporters as Prometheus file_sd JSON, labelled by node")
    add_spec_file(p)
    add_state_dir(p, "where the nodes' records are (default: .opsctl/<name> next to the spec): the targets are the "
                     "nodes deployed, where they run")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE",
                   help="write it to FILE atomically (temp file + rename: Prometheus watches it) instead of stdout")
    where.add_argument("--write-to", metavar="HOST:PATH",
                   help="write it over SSH to PATH on HOST (a host of the spec, or [user@]address), atomically, "
                        "mode 0644: where Prometheus runs")
    add_output(p, ("json",), "file_sd JSON, the one format Prometheus reads",
               moved=Moved("metrics targets", "file", "--out"))
    p.add_argument("--only", metavar="NAME[,NAME]", help="with -f DIR: these topologies' exporters only")
    p.set_defaults(handler=cmd_targets)
    p = commands.add_parser("rules", help="write the alert rules, their promtool tests and the Grafana dashboard "
                                          "shipped with opsctl into a folder")
    p.add_argument("--dir", required=True, metavar="DIR",
                   help="an existing folder: alerts.yml, tests/*.yml (promtool test rules), opsctl-redis.json")
    p.add_argument("--force", action="store_true", help="replace those files where they exist already")
    add_output(p)
    p.set_defaults(handler=cmd_rules)
