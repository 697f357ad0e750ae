"""Checks that span fields: references between sections, placement, ports, hardening, secrets.

Each check yields (field path, message, hint); the loader turns them into SpecProblems with lines.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterator

from opsctl.base.errors import echo
from opsctl.server.config_types import value_problem
from opsctl.server.versions import (
    SUPPORTED,
    Version,
    command_names,
    has_directive,
    is_category,
    is_command,
    is_supported,
    parse_version,
    version_text,
)
from opsctl.spec.aclrules import check_rules
from opsctl.spec.follows import check_follows
from opsctl.spec.layout import (
    MAX_PORT,
    PUBLIC_BINDS,
    Layout,
    canonical_address,
    host_bind,
    layout,
    missing_refs,
    replication_hosts,
    sentinel_hosts,
)
from opsctl.spec.model import (
    LAZYFREE,
    PLAINTEXT_PORT_OFFSET,
    POLICIES,
    TOPOLOGIES,
    Host,
    Spec,
    config_text,
)
from opsctl.spec.portchecks import check_bastion_port, check_bus_offset, check_exporter_ports, check_ports, own_ports
from opsctl.spec.secretrefs import SecretResolver, check_secrets, unquoted

Finding = tuple[tuple[str | int, ...], str, str]


class Refusal(tuple[tuple[str | int, ...], str, str]):
    """A finding that breaks a safety rule rather than the spec's form: alone, it exits 3 (refused), not 1."""

COMMANDS_OPSCTL_NEEDS = {"AUTH", "HELLO", "PING", "INFO", "CONFIG", "CLUSTER", "REPLICAOF", "SLAVEOF",
                         "ROLE", "MIGRATE", "FAILOVER", "SHUTDOWN", "CLIENT", "SCAN", "TYPE", "MEMORY",
                         "SENTINEL", "WAIT", "DEBUG", "OBJECT", "SLOWLOG", "ACL", "COMMAND"}
NOT_DISABLABLE = COMMANDS_OPSCTL_NEEDS - {"DEBUG"}
COMMAND_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
RENAMED_NAME = re.compile(r"^[A-Za-z0-9_]{4,64}$")
DIRECTIVE_NAME = re.compile(r"^[a-z][a-z0-9-]*$")

# Directives opsctl derives from spec fields: set them there, not under config.
MANAGED_DIRECTIVES = {
    "port": "cluster.base_port / standalone.port / replication.base_port / nodes.<name>.port",
    "bind": "hosts[].bind",
    "requirepass": "auth.password", "masterauth": "auth.password", "masteruser": "auth.admin_user",
    "aclfile": "auth.mode: acl", "user": "auth.users",
    "rename-command": "hardening.renamed_commands / hardening.disabled_commands",
    "appendonly": "persistence.aof", "appendfsync": "persistence.aof", "save": "persistence.rdb",
    "maxmemory": "memory.maxmemory", "maxmemory-policy": "memory.policy",
    "cluster-enabled": "topology", "cluster-config-file": "topology", "cluster-port": "cluster.bus_port_offset",
    "cluster-node-timeout": "cluster.node_timeout_ms",
    "cluster-require-full-coverage": "cluster.require_full_coverage",
    "cluster-replica-validity-factor": "cluster.replica_validity_factor",
    "cluster-allow-reads-when-down": "cluster.allow_reads_when_down",
    "replicaof": "replication.master", "slaveof": "replication.master",
    # What a node announces is its address and ports in the spec: opsctl finds nodes, replicas and peers by them.
    # cluster-announce-client-ipv4/-ipv6 (Valkey) rewrite the address a client sees in CLUSTER NODES (and SHARDS,
    # MOVED): opsctl reads its views as a client. Left free: cluster-announce-hostname and -human-nodename (a field
    # beside the address, a name in the logs) and cluster-preferred-endpoint-type (what CLUSTER SLOTS and MOVED show
    # clients): CLUSTER NODES keeps the address, by which opsctl knows each node.
    **{name: "hosts[].address" for name in ("cluster-announce-ip", "replica-announce-ip", "slave-announce-ip",
                                            "cluster-announce-client-ipv4", "cluster-announce-client-ipv6")},
    **{name: "the node's port (a node announces the port it listens on)" for name in (
        "cluster-announce-port", "cluster-announce-tls-port", "cluster-announce-client-port",
        "cluster-announce-client-tls-port", "replica-announce-port", "slave-announce-port")},
    "cluster-announce-bus-port": "cluster.bus_port_offset",
    "dir": "the provider's state directory", "pidfile": "the provider", "logfile": "the provider",
    "daemonize": "the provider", "include": "nothing: one rendered file per node",
    **{name: "the tls section" for name in ("tls-port", "tls-cert-file", "tls-key-file", "tls-ca-cert-file",
                                            "tls-auth-clients", "tls-replication", "tls-cluster", "tls-protocols")},
}
# Directive -> the values that undo hardening (allowed only with hardening.allow_unsafe).
UNSAFE_VALUES: dict[str, set[str]] = {
    "protected-mode": {"no"},
    "enable-protected-configs": {"yes", "local"},
    "enable-debug-command": {"yes", "local"},
    "enable-module-command": {"yes", "local"},
    "cluster-allow-replica-migration": {"yes"},
    "loadmodule": {"*"},
    **{name: {"no"} for name in LAZYFREE},
}


def suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def check_spec(spec: Spec, resolve: SecretResolver | None) -> Iterator[Finding]:
    """resolve None: secrets are not looked at (validate --no-secrets)."""
    yield from _check_version(spec)
    yield from _check_sections(spec)
    host_findings = [*_check_hosts(spec), *_check_references(spec)]
    yield from host_findings
    if not any(path[-1] == "name" or path[0] != "hosts" for path, _, _ in host_findings):
        yield from _check_placement(spec)  # placement over misnamed or unknown hosts only echoes those
    yield from _check_commands(spec)
    yield from _check_slot_stats(spec)
    yield from _check_memory(spec)
    yield from _check_rdb(spec)
    yield from _check_config(spec, spec.config, ("config",))
    yield from _check_overrides(spec)
    yield from _check_users(spec)
    yield from check_follows(spec, resolve)
    if resolve is not None:
        yield from check_secrets(spec, resolve)
    nodes = layout(spec)
    yield from check_ports(spec, nodes)
    yield from check_bus_offset(spec)
    yield from _check_tls(spec, nodes)
    yield from _check_write_quorum(spec, nodes)
    yield from check_exporter_ports(spec, nodes)


def _check_version(spec: Spec) -> Iterator[Finding]:
    flavor, version = spec.server.flavor, parse_version(spec.server.version)
    if not is_supported(flavor, version):
        known = ", ".join(version_text(v) for v in SUPPORTED[flavor])
        yield (("server", "version"), f"{flavor} {spec.server.version} is not a supported version",
               f"use one of: {known}")


def _check_sections(spec: Spec) -> Iterator[Finding]:
    wanted = {"cluster": {"cluster"}, "standalone": {"standalone"}, "replication": {"replication"},
              "sentinel": {"replication", "sentinel"}}[spec.topology]
    for section in TOPOLOGIES:
        if getattr(spec, section) is not None and section not in wanted:
            yield ((section,), f"section given but topology is {spec.topology}",
                   f"remove '{section}:' or set topology: {section}")


def _check_hosts(spec: Spec) -> Iterator[Finding]:
    seen_names: dict[str, int] = {}
    seen_addresses: dict[str, int] = {}
    for i, host in enumerate(spec.hosts):
        if host.name in seen_names:
            yield (("hosts", i, "name"), f"host name '{host.name}' is used twice (also hosts[{seen_names[host.name]}])",
                   "give every host its own name")
        seen_names.setdefault(host.name, i)
        address = canonical_address(host.address)
        if address in seen_addresses:
            yield (("hosts", i, "address"),
                   f"address {echo(host.address)} is used twice (also hosts[{seen_addresses[address]}])",
                   "one entry per machine; anti-affinity needs distinct hosts")
        seen_addresses.setdefault(address, i)
        yield from _check_address(spec, i, host.address, ("hosts", i, "address"))
        for j, address in enumerate(host.bind or []):
            yield from _check_address(spec, i, address, ("hosts", i, "bind", j))
        yield from _check_source_address(spec, i, host)
        yield from check_bastion_port(i, host)
        if host.admin_via_ssh and spec.provider != "ansible":
            yield (("hosts", i, "admin_via_ssh"), "admin_via_ssh needs provider: ansible",
                   "the local provider reaches its nodes directly; remove admin_via_ssh")


def _check_address(spec: Spec, index: int, address: str, path: tuple[str | int, ...]) -> Iterator[Finding]:
    if address in PUBLIC_BINDS or canonical_address(address) in PUBLIC_BINDS:
        if not spec.hardening.allow_public_bind:
            yield (path, f"{echo(address)} listens on every interface",
                   "bind the host's own LAN address, or set hardening.allow_public_bind: true")
        return
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        if spec.provider == "local":
            yield (path, f"{echo(address)} is not an IP address",
                   "the local provider needs loopback addresses like 127.0.0.2")
        return
    if spec.provider == "local" and not ip.is_loopback:
        yield (path, f"{address} is not a loopback address, but provider is local",
               "use 127.0.0.1, 127.0.0.2, ... for local processes, or provider: ansible for real hosts")


def _check_source_address(spec: Spec, index: int, host: Host) -> Iterator[Finding]:
    """bind-source-addr must be an address of the host's own, or every outgoing connection of its nodes fails."""
    address, path = host.source_address, ("hosts", index, "source_address")
    if address is None:
        return
    try:
        ipaddress.ip_address(address)
    except ValueError:
        yield (path, f"{echo(address)} is not an IP address", "give the IP address of one of the host's interfaces")
        return
    bind = host_bind(host)
    if canonical_address(address) not in bind and not set(bind) & PUBLIC_BINDS:
        yield (path, f"{address} is neither the host's address nor one of its bind addresses",
               "give the address its nodes listen on (address, or one of bind)")
    if not has_directive(spec.server.flavor, parse_version(spec.server.version), "bind-source-addr"):
        yield (path, f"{spec.server.flavor} {spec.server.version} has no bind-source-addr",
               "use Redis >= 7.0 or Valkey, or leave source_address out")


def _check_slot_stats(spec: Spec) -> Iterator[Finding]:
    if spec.topology != "cluster" or not spec.cluster_or_default().slot_stats:
        return
    if not has_directive(spec.server.flavor, parse_version(spec.server.version), "cluster-slot-stats-enabled"):
        yield (("cluster", "slot_stats"), f"{spec.server.flavor} {spec.server.version} keeps no per-slot statistics "
               "(cluster-slot-stats-enabled)",
               "use Valkey 8.0 or later, or leave slot_stats out: `cluster rebalance --by keys|memory` samples")


def _check_write_quorum(spec: Spec, nodes: Layout) -> Iterator[Finding]:
    """A master waiting for more replicas than its shard has refuses every write."""
    wanted, path = spec.persistence.min_replicas_to_write, ("persistence", "min_replicas_to_write")
    if not wanted:
        return
    fewest = min((len(shard.replicas) for shard in nodes.shards), default=0)
    if wanted > fewest:
        yield (path, f"{wanted} replicas must acknowledge a write, but a shard has {fewest}: its master would refuse "
                     "every write", f"set at most {fewest}, or 0 to turn the check off")


def _check_references(spec: Spec) -> Iterator[Finding]:
    names = [h.name for h in spec.hosts]

    def unknown(path: tuple[str | int, ...], name: str) -> Finding:
        return (path, f"unknown host {echo(name)}", f"{suggest(name, names)}hosts are: {', '.join(names)}")

    if spec.standalone and spec.standalone.host and spec.standalone.host not in names:
        yield unknown(("standalone", "host"), spec.standalone.host)
    if spec.replication:
        if spec.replication.master and spec.replication.master not in names:
            yield unknown(("replication", "master"), spec.replication.master)
        for i, name in enumerate(spec.replication.replicas or []):
            if name not in names:
                yield unknown(("replication", "replicas", i), name)
    if spec.sentinel:
        for i, name in enumerate(spec.sentinel.hosts or []):
            if name not in names:
                yield unknown(("sentinel", "hosts", i), name)


def _check_placement(spec: Spec) -> Iterator[Finding]:
    if spec.topology == "cluster":
        topo = spec.cluster_or_default()
        if len(spec.hosts) < topo.replicas_per_master + 1:
            yield Refusal((("hosts",), f"refused by the anti-affinity rule (no two members of a shard on one "
                           f"host): {len(spec.hosts)} host(s) cannot hold the declared shape, each of "
                           f"{topo.replicas_per_master} replica(s) per master off its master's host and off each "
                           "other's", f"add hosts (at least {topo.replicas_per_master + 1}) or lower "
                           "cluster.replicas_per_master"))
        return
    if spec.topology in ("replication", "sentinel"):
        yield from _check_replication_placement(spec)
    if spec.topology == "sentinel":
        yield from _check_sentinel_placement(spec)


def _check_replication_placement(spec: Spec) -> Iterator[Finding]:
    master, replicas = replication_hosts(spec)
    if not replicas:
        yield (("hosts",), "replication needs at least one replica on a host other than the master's",
               "add a host, or list replication.replicas")
    declared = spec.replication.replicas if spec.replication and spec.replication.replicas else []
    seen: set[str] = set()
    for i, name in enumerate(declared):
        if name == master.name:
            yield (("replication", "replicas", i), f"replica on the master's host '{name}'",
                   "a replica must live on another host than its master")
        elif name in seen:
            yield (("replication", "replicas", i), f"host '{name}' is listed twice", "one replica per host")
        seen.add(name)


def _check_sentinel_placement(spec: Spec) -> Iterator[Finding]:
    hosts = sentinel_hosts(spec)
    declared = spec.sentinel.hosts if spec.sentinel and spec.sentinel.hosts else []
    path: tuple[str | int, ...] = ("sentinel", "hosts") if declared else ("hosts",)
    if len(set(declared)) != len(declared):
        yield (path, "a host is listed twice", "run each sentinel on its own host")
    if len(hosts) < 3:
        yield (path, f"{len(hosts)} sentinel host(s): a failover needs a majority of at least 3",
               "list three or more distinct hosts (an odd number)")
    quorum = spec.sentinel.quorum if spec.sentinel else None
    if quorum is not None and quorum > len(hosts):
        yield (("sentinel", "quorum"), f"quorum {quorum} is more than the {len(hosts)} sentinel(s)",
               f"use at most {len(hosts)}; a majority ({len(hosts) // 2 + 1}) is usual")


def _check_commands(spec: Spec) -> Iterator[Finding]:
    hardening = spec.hardening
    for i, command in enumerate(hardening.disabled_commands):
        path: tuple[str | int, ...] = ("hardening", "disabled_commands", i)
        problem = _command_problem(spec, command, "FLUSHALL")
        if problem:
            yield (path, *problem)
        elif command.upper() in NOT_DISABLABLE:
            yield (path, f"opsctl needs {command.upper()} to manage the server",
                   f"rename it instead: hardening.renamed_commands: {{{command.upper()}: <secret name>}}")
    disabled = {c.upper() for c in hardening.disabled_commands}
    new_names: set[str] = set()
    for command, new_name in hardening.renamed_commands.items():
        path = ("hardening", "renamed_commands", command)
        problem = _command_problem(spec, command, "CONFIG")
        if problem:
            yield (path, *problem)
        elif command.upper() in disabled:
            yield (path, f"{command} is both disabled and renamed", "keep it in one of the two lists")
        if not RENAMED_NAME.match(new_name):
            yield (path, f"new name {echo(new_name)} must be 4 to 64 letters, digits or _",
                   "to disable a command list it under hardening.disabled_commands")
        elif any(is_command(flavor, version, new_name) for flavor, version in _all_servers()):
            yield (path, f"new name {echo(new_name)} is the name of an existing command",
                   "pick a name no server command has, e.g. OPS_<COMMAND>_<random>")
        elif new_name.upper() in new_names:
            yield (path, f"new name {echo(new_name)} is used twice", "give every renamed command its own name")
        new_names.add(new_name.upper())


def _all_servers() -> list[tuple[str, Version]]:
    return [(flavor, version) for flavor, versions in SUPPORTED.items() for version in versions]


def _command_problem(spec: Spec, command: str, example: str) -> tuple[str, str] | None:
    """Why command cannot be disabled or renamed on the spec's server, or None."""
    if "|" in command and COMMAND_NAME.match(command.replace("|", "")):
        parent = command.split("|")[0].upper()
        return (f"{echo(command)} is a subcommand: rename-command works on whole commands only",
                f"disable or rename {parent}, or deny the subcommand in ACL rules (auth.mode: acl, -{command.lower()})")
    if not COMMAND_NAME.match(command):
        return f"{echo(command)} is not a command name", f"use names like {example}"
    flavor, version = spec.server.flavor, parse_version(spec.server.version)
    if not is_command(flavor, version, command):
        known = sorted(n.upper() for n in command_names(flavor, version) if "|" not in n)
        return (f"unknown command {echo(command)} for {flavor} {spec.server.version}",
                f"{suggest(command.upper(), known)}see COMMAND LIST on the server")
    return None


def _check_memory(spec: Spec) -> Iterator[Finding]:
    if spec.memory.policy not in POLICIES:
        yield (("memory", "policy"), f"unknown maxmemory policy {echo(spec.memory.policy)}",
               f"{suggest(spec.memory.policy, POLICIES)}use one of: {', '.join(POLICIES)}")
    if spec.memory.maxmemory.rstrip("bkmg") in ("0", ""):
        yield (("memory", "maxmemory"), "0 means no limit: the server swaps or dies when memory runs out",
               "set an explicit size such as 256mb")


def _check_rdb(spec: Spec) -> Iterator[Finding]:
    for i, rule in enumerate(spec.persistence.rdb):
        parts = rule.split()
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            yield (("persistence", "rdb", i), f"{echo(rule)} is not '<seconds> <changes>'",
                   "write it like \"900 1\"; use rdb: [] to turn snapshots off")


def _check_config(spec: Spec, config: dict[str, str | int | bool],
                  path: tuple[str | int, ...]) -> Iterator[Finding]:
    allow_unsafe = spec.hardening.allow_unsafe
    flavor, version = spec.server.flavor, parse_version(spec.server.version)
    for directive, value in config.items():
        at = (*path, directive)
        if not DIRECTIVE_NAME.match(directive):
            yield (at, f"{echo(directive)} is not a directive name", "use lowercase names like hz or maxclients")
        elif directive in MANAGED_DIRECTIVES:
            yield (at, f"{directive} is managed by opsctl", f"set it through {MANAGED_DIRECTIVES[directive]}")
        elif directive in UNSAFE_VALUES and not allow_unsafe:
            bad = UNSAFE_VALUES[directive]
            if "*" in bad or config_text(value).lower() in bad:
                yield (at, f"{directive} {config_text(value)} undoes hardening",
                       "remove it, or set hardening.allow_unsafe: true if you really mean it")
                continue
        if DIRECTIVE_NAME.match(directive) and directive not in MANAGED_DIRECTIVES:
            problem = value_problem(flavor, version, directive, config_text(value))
            if problem:
                yield (at, unquoted(problem[0], config_text(value), at), problem[1])


def _check_overrides(spec: Spec) -> Iterator[Finding]:
    names = [n.name for n in layout(spec).nodes]
    for name, override in spec.nodes.items():
        if name not in names:
            yield (("nodes", name), f"no node named {echo(name)}",
                   f"{suggest(name, names)}nodes are: {', '.join(names)}")
        yield from _check_config(spec, override.config, ("nodes", name, "config"))


def _check_users(spec: Spec) -> Iterator[Finding]:
    if spec.auth.users and spec.auth.mode != "acl":
        yield (("auth", "users"), "users need auth.mode: acl", "set auth.mode: acl or remove auth.users")
    admin = spec.auth.admin_user
    if admin == "default":
        yield (("auth", "admin_user"), "the admin user cannot be 'default' (opsctl turns that user off)",
               "keep the default, opsctl, or pick another name")
    seen: set[str] = set()
    for i, user in enumerate(spec.auth.users):
        if user.name in ("default", admin):
            what = "opsctl turns the default user off" if user.name == "default" else "it is opsctl's own admin user"
            yield (("auth", "users", i, "name"), f"user name '{user.name}' is reserved: {what}",
                   "give the application user its own name")
        elif user.name in seen:
            yield (("auth", "users", i, "name"), f"user '{user.name}' is listed twice", "one entry per user")
        seen.add(user.name)
        for message, hint in check_rules(user.rules, spec.hardening.allow_unsafe, _server_knows(spec)):
            yield (("auth", "users", i, "rules"), message, hint)


def _server_knows(spec: Spec) -> Callable[[str], bool]:
    flavor, version = spec.server.flavor, parse_version(spec.server.version)

    def knows(name: str) -> bool:
        if name.startswith("@"):
            return is_category(flavor, version, name[1:])
        return is_command(flavor, version, name)

    return knows


def _check_tls(spec: Spec, nodes: Layout) -> Iterator[Finding]:
    """Given certificates: every node needs a CA, a certificate and a key. plaintext_port: port + 1000 free."""
    tls = spec.tls
    if not tls.enabled:
        return
    if not tls.generate:
        for node in nodes.nodes:
            missing = missing_refs(spec, node)
            if missing:
                yield (("tls",), f"{node.name} has no tls {', '.join(missing)} file",
                       "set tls.ca/cert/key (or per host: hosts[].tls, per node: nodes.<name>.tls), "
                       "or let opsctl make them: tls.generate: true")
                return
    if tls.plaintext_port:
        used = {(a, p): what for n in nodes.nodes for a in n.listens_on for p, what in own_ports(n)}
        for node in nodes.nodes:
            plain = node.port + PLAINTEXT_PORT_OFFSET
            taken = next((used[(a, plain)] for a in node.listens_on if (a, plain) in used), None)
            if plain > MAX_PORT or taken:
                why = f"above {MAX_PORT}" if plain > MAX_PORT else f"taken by {taken}"
                yield (("tls", "plaintext_port"), f"{node.name}'s plaintext port {plain} (port + "
                       f"{PLAINTEXT_PORT_OFFSET}) is {why}", "lower the base port, or leave plaintext_port off")
                return
