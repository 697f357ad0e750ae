"""`opsctl inventory -f SPEC`: write a standard Ansible inventory (and optionally the node files) for the spec."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

from opsctl.base.errors import EXIT_ERROR, EXIT_OK, OpsctlError
from opsctl.cli.commands.fleetrun import add_fleet_options, fleet_of
from opsctl.cli.options import (
    Moved,
    add_dir,
    add_offline,
    add_output,
    add_spec_file,
    add_state_dir,
    placed_unless_offline,
)

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.cli.results import Inventoried
    from opsctl.spec.load import LoadedSpec


def write_inventory(args: argparse.Namespace, output: Path, as_json: bool = False
                    ) -> tuple[list[str], dict[str, Any] | None]:
    """Write the inventory into output (the --dir folder) and, --with-files, the installers beside it, for the nodes
    placed from their records (the deployed ones and those the next apply adds: deploy.yml and destroy.yml act on
    the nodes that run). as_json: the inventory is not written but returned in Ansible's JSON form (to print); the
    installers still go to the folder. Returns what was done, as lines, and that JSON."""
    from opsctl.state.specfile import read_spec

    loaded = read_spec(args.file)
    refuse_local(loaded)  # before anything is written (or looked for over SSH)
    return inventory_of(loaded, args, args.file, output, as_json)


def inventory_of(loaded: LoadedSpec, args: argparse.Namespace, spec_file: str, output: Path, as_json: bool = False
                 ) -> tuple[list[str], dict[str, Any] | None]:
    """write_inventory for one provider: ansible topology, read (a fleet's, or -f SPEC's: spec_file, as the
    playbook command names it)."""
    from opsctl.providers.remote.bundle import stage
    from opsctl.providers.remote.inventory import build_inventory, inventory_script_form, inventory_text, remote_paths
    from opsctl.providers.remote.ssh import known_hosts_path
    from opsctl.render import render_node
    from opsctl.state.localdirs import state_dir_for
    from opsctl.state.safefs import make_dir, trusted_owners, write_private
    from opsctl.tls.material import node_files

    with_files, known_hosts = args.with_files, args.known_hosts
    loaded = placed_unless_offline(loaded, args)
    name = loaded.spec.name
    files_dir = (output / f"{name}.files").resolve()
    inventory = build_inventory(loaded, str(files_dir), known_hosts_path(known_hosts))
    target = output / f"{name}.yml"
    lines = []
    if not as_json:
        make_dir(output.resolve(), owners=trusted_owners(), enforce=False)  # never into a foreign folder
        write_private(target, inventory_text(inventory, loaded.file))  # never through a link
        lines.append(f"wrote {target}")
    if with_files:
        tls_dir = state_dir_for(loaded, args.state_dir)
        stage(loaded, files_dir, {node.name: {**render_node(loaded, node, remote_paths(loaded.spec, node), reveal=True,
                                                            daemonize=True).files,
                                              **node_files(loaded, tls_dir, node)} for node in loaded.layout.nodes})
        lines.append(f"wrote one installer per host (mode 0600, they hold the password) under {files_dir}")
    if not as_json:
        lines.append(playbook_command(spec_file, output, target, with_files))
    return lines, inventory_script_form(inventory) if as_json else None


def refuse_local(loaded: LoadedSpec) -> None:
    """An inventory is for SSH hosts: a provider: local spec's nodes run on this machine, deployed by apply."""
    if loaded.spec.provider != "ansible":
        raise OpsctlError(f"{loaded.file} has provider: {loaded.spec.provider}: an inventory is for a provider: "
                          "ansible spec", "its nodes run on this machine, where `opsctl apply` deploys them",
                          f"opsctl apply -f {shlex.quote(str(loaded.file))}, or set provider: ansible and SSH "
                          "hosts (docs/remote.md)")


def playbook_command(spec_file: str, output: Path, target: Path, with_files: bool) -> str:
    """The command that deploys with the inventory just written: the deploy playbook by its installed path (it ships
    in the package, a checkout's playbooks/ exists only in a checkout), and, without --with-files, the run that
    writes the installers it needs first."""
    from opsctl import data_dir

    run = f"ansible-playbook -i {shlex.quote(str(target))} {shlex.quote(str(data_dir('playbooks') / 'deploy.yml'))}"
    if with_files:
        return f"run: {run}"
    first = f"opsctl inventory -f {shlex.quote(spec_file)} --dir {shlex.quote(str(output))} --with-files"
    return f"run: {first} && {run}  (deploy.yml installs the node files --with-files writes)"


def _inventory(args: argparse.Namespace) -> int:
    """As text, what was written on stdout; as JSON, the inventory on stdout (an inventory script's answer) and
    what was written (--with-files) on stderr."""
    import json
    from pathlib import Path

    from opsctl.cli.commands.fleetrun import is_folder
    from opsctl.cli.output import Lines

    as_json = args.output == "json"
    if as_json and not args.with_files:  # the inventory goes to stdout: no folder is written into
        from opsctl.cli.options import refuse_given

        refuse_given(args, ("dir",), "a written inventory (text) or --with-files' installers, not with -o json "
                     "alone (it prints the inventory)", "drop --dir, or add --with-files")
    if is_folder(args):
        return inventory_fleet(args)
    lines, inventory = write_inventory(args, Path(args.dir or DEFAULT_DIR), as_json)
    said = Lines(args.output)  # as JSON, note events on stderr: stdout holds the inventory
    for line in lines:
        said(line)
    if inventory is not None:
        print(json.dumps(inventory, indent=2))
    return EXIT_OK


DEFAULT_DIR = "inventories"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("inventory", help="write an Ansible inventory for a provider: ansible spec",
                       description="Write an Ansible inventory of the nodes deployed (name, host, port from their "
                                   "records on the hosts; retired ones left out) and the nodes the next apply adds. "
                                   "Nothing deployed yet, or hosts out of reach: where a first deploy puts them "
                                   "(said on stderr).")
    add_spec_file(p)
    add_fleet_options(p)
    add_dir(p, f"the folder to write the inventory (and --with-files' installers) into (default: {DEFAULT_DIR})",
            default=DEFAULT_DIR)
    p.set_defaults(dir=None)  # DEFAULT_DIR when not given: -o json refuses a --dir it would not write into
    add_output(p, about="text: write DIR/<name>.yml and say so; json: print the inventory in Ansible's JSON form "
                        "(an inventory script's answer to --list) instead of writing it",
               moved=Moved("inventory", "folder", "--dir"))
    p.add_argument("--with-files", action="store_true",
                   help="also write the installers deploy.yml runs, one per host with its node files (0600, real "
                        "secrets), beside the inventory")
    p.add_argument("--known-hosts", help="known_hosts file for host key checks (default: $OPSCTL_SSH_KNOWN_HOSTS "
                                         "or ~/.ssh/known_hosts)")
    add_state_dir(p, "where generated TLS certificates live (default: .opsctl/<name> next to the spec); the nodes' "
                     "records are read on the hosts over SSH")
    add_offline(p)
    p.set_defaults(handler=_inventory)


def inventory_fleet(args: argparse.Namespace) -> int:
    """inventory -f DIR: each provider: ansible topology's inventory (DIR/<name>.yml in --dir); the local ones run
    on this machine and have none: left out, said on stderr."""
    from pathlib import Path

    from opsctl.cli.output import print_result, say
    from opsctl.cli.results import Inventoried
    from opsctl.fleet.summary import FleetResult, run_each

    fleet = fleet_of(args)
    remote = [s for s in fleet.specs if s.spec.provider == "ansible"]
    local = [s.spec.name for s in fleet.specs if s.spec.provider != "ansible"]
    if not remote:
        raise OpsctlError(f"{fleet.folder}: no provider: ansible topology among {', '.join(local)}: an inventory "
                          "is for SSH hosts", hint="`opsctl apply -f DIR` deploys provider: local topologies")
    if local:
        say(f"note: left out (provider: local, no inventory): {', '.join(local)}", args.output == "json")
    output, as_json = Path(args.dir or DEFAULT_DIR), args.output == "json"

    def one(loaded: LoadedSpec) -> Inventoried:
        lines, inventory = inventory_of(loaded, args, str(loaded.file), output, as_json)
        return Inventoried(tuple(lines), inventory)

    result = FleetResult("inventory", tuple(run_each(one, remote, args.parallel)))
    print_result(result, args.output)
    return EXIT_ERROR if result.failed else EXIT_OK
