"""The directives each node runs with, by section, for its flavor and version. Pure data from a spec.

The same list feeds the rendered file and the comparison with a live node's CONFIG GET.
"""

from __future__ import annotations

from opsctl.base.frozen import Frozen, frozen
from opsctl.render.tokens import quoted, word
from opsctl.server.versions import has_capability, has_directive, parse_version
from opsctl.spec.layout import Node, sentinel_hosts, sentinel_master_name, sentinel_quorum
from opsctl.spec.load import LoadedSpec
from opsctl.spec.model import LAZYFREE, PLAINTEXT_PORT_OFFSET, Spec, config_text

Directive = tuple[str, str]

# Directives whose value is a secret: never shown, compared only against the resolved credentials.
SECRET_DIRECTIVES = frozenset({"requirepass", "masterauth"})


@frozen
class NodePaths(Frozen):
    """Where a node's files live on its host."""

    dir: str
    conf: str
    acl: str
    log: str
    pid: str


@frozen
class Section(Frozen):
    title: str
    directives: tuple[Directive, ...]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def supported(spec: Spec, directives: list[Directive]) -> tuple[Directive, ...]:
    version = parse_version(spec.server.version)
    return tuple(d for d in directives if has_directive(spec.server.flavor, version, d[0]))


MAXCLIENTS = "10000"  # what opsctl renders unless the spec's config says otherwise


def network(spec: Spec, node: Node) -> list[Directive]:
    """replica-announce-ip: masters and sentinels otherwise see the connection's source address."""
    return [("bind", _bind(node)), *source_address(spec, node), *ports(spec, node),
            ("replica-announce-ip", word(node.address)), ("protected-mode", "yes"),
            ("tcp-backlog", "511"), ("timeout", "0"), ("tcp-keepalive", "300"), ("maxclients", MAXCLIENTS)]


def maxclients(spec: Spec, node: Node) -> int | None:
    """The maxclients a server is rendered with (the spec's config, a node override, else MAXCLIENTS); None when
    it is not a number."""
    value = dict(extra(spec, node)).get("maxclients", MAXCLIENTS)
    return int(value) if value.isdigit() else None


def _bind(node: Node) -> str:
    return " ".join(word(address) for address in node.bind)


def source_address(spec: Spec, node: Node) -> list[Directive]:
    """bind-source-addr from the node's host (hosts[].source_address): the address its outgoing connections
    leave from, so that peers and firewalls tell a multi-homed host's nodes by their source address."""
    address = next((h.source_address for h in spec.hosts if h.name == node.host), None)
    return [("bind-source-addr", word(address))] if address else []
# The node's TLS files, next to its config on its host.
TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE = "tls-ca.crt", "tls.crt", "tls.key"


def plaintext_port(spec: Spec, node: Node) -> int | None:
    """The port that answers without TLS: the node's port without TLS, port + 1000 with plaintext_port, else None."""
    if not spec.tls.enabled:
        return node.port
    return node.port + PLAINTEXT_PORT_OFFSET if spec.tls.plaintext_port else None


def listen_ports(spec: Spec, node: Node) -> list[int]:
    """Every port node listens on: its port, its plaintext port (tls.plaintext_port), its cluster bus port."""
    plain = plaintext_port(spec, node)
    extra = [plain] if plain is not None and plain != node.port else []
    return [node.port, *extra, *([node.bus_port] if node.bus_port is not None else [])]


def ports(spec: Spec, node: Node) -> list[Directive]:
    """With TLS the node's port is its tls-port; `port 0` closes the plaintext one."""
    if not spec.tls.enabled:
        return [("port", str(node.port))]
    return [("port", str(plaintext_port(spec, node) or 0)), ("tls-port", str(node.port))]


def tls(spec: Spec, paths: NodePaths, sentinel: bool = False) -> list[Directive]:
    """Certificates, client authentication, protocols; TLS for replication and the cluster bus too."""
    if not spec.tls.enabled:
        return []
    lines: list[Directive] = [
        ("tls-cert-file", quoted(f"{paths.dir}/{TLS_CERT_FILE}")),
        ("tls-key-file", quoted(f"{paths.dir}/{TLS_KEY_FILE}")),
        ("tls-ca-cert-file", quoted(f"{paths.dir}/{TLS_CA_FILE}")),
        ("tls-auth-clients", {"required": "yes", "optional": "optional", "no": "no"}[spec.tls.client_auth]),
        ("tls-protocols", quoted(" ".join(spec.tls.protocols))), ("tls-replication", "yes")]
    if spec.topology == "cluster" and not sentinel:
        lines.append(("tls-cluster", "yes"))
    return lines


def process(node: Node, paths: NodePaths, daemonize: bool) -> list[Directive]:
    return [("daemonize", _yes(daemonize)), ("pidfile", word(paths.pid)), ("logfile", word(paths.log)),
            ("loglevel", "notice"), ("dir", word(paths.dir))]


def security(loaded: LoadedSpec, paths: NodePaths, password: str) -> list[Directive]:
    spec = loaded.spec
    lines: list[Directive]
    if spec.auth.mode == "password":
        lines = [("requirepass", quoted(password)), ("masterauth", quoted(password))]
    else:
        lines = [("aclfile", word(paths.acl)), ("masteruser", word(spec.auth.admin_user)),
                 ("masterauth", quoted(password))]
    lines += [("enable-protected-configs", "no"), ("enable-debug-command", "no"),
              ("enable-module-command", "no"), ("hide-user-data-from-log", "yes")]
    return lines


def renames(loaded: LoadedSpec) -> list[Directive]:
    """rename-command lines: disabled commands to "", renamed ones (the spec's and, in password mode, the
    takeover commands: opsctl.spec.load) to their new name.

    Disabled commands go in ACL mode too: ACL rules alone can be undone by any user allowed ACL SETUSER
    (the admin has +@all), a removed command cannot. ACL rules keep naming them (rules use original names).
    """
    disabled = loaded.spec.hardening.disabled_commands
    lines: list[Directive] = [("rename-command", f'{word(c.upper())} ""') for c in disabled]
    lines += [("rename-command", f"{word(c)} {word(new)}") for c, new in sorted(loaded.renames.items())]
    return lines


def persistence(spec: Spec) -> list[Directive]:
    aof = spec.persistence.aof
    lines = [("appendonly", _yes(aof != "off"))]
    if aof != "off":
        lines += [("appendfsync", aof), ("appendfilename", '"appendonly.aof"'), ("aof-use-rdb-preamble", "yes")]
    lines += _save(spec)
    lines += [("dbfilename", "dump.rdb"), ("stop-writes-on-bgsave-error", "yes")]
    return lines


def _save(spec: Spec) -> list[Directive]:
    """One `save` line with every rule where the server takes it; one line per rule on Redis 6.2."""
    rules = spec.persistence.rdb
    if not rules:
        return [("save", '""')]
    if has_capability(spec.server.flavor, parse_version(spec.server.version), "multi_arg_save"):
        return [("save", " ".join(rules))]
    return [("save", rule) for rule in rules]


def memory(spec: Spec) -> list[Directive]:
    lines = [("maxmemory", spec.memory.maxmemory), ("maxmemory-policy", spec.memory.policy)]
    return lines + [(name, _yes(spec.lazyfree)) for name in LAZYFREE]


def replicas_per_shard(spec: Spec) -> int:
    if spec.topology == "cluster":
        return spec.cluster_or_default().replicas_per_master
    if spec.topology == "standalone":
        return 0
    replicas = spec.replication_or_default().replicas
    return len(replicas) if replicas is not None else len(spec.hosts) - 1


def replication(spec: Spec) -> list[Directive]:
    """Replication: diskless sync, and replicas that save a sync to disk before loading it.
    repl-diskless-sync-delay is 0 with one replica per master (no company to wait for), else 1, so replicas restarted
    together share one fork; repl-diskless-load is said explicitly because a new cluster's replicas load from the
    socket while it forms, and drift must see a run that died before setting it back."""
    per_shard = replicas_per_shard(spec)
    return [("repl-backlog-size", "64mb"), ("repl-diskless-sync", "yes"),
            ("repl-diskless-sync-delay", "1" if per_shard > 1 else "0"),
            ("repl-diskless-sync-max-replicas", str(per_shard)), ("repl-diskless-load", "disabled"),
            ("replica-read-only", "yes"),
            ("replica-serve-stale-data", "yes"), *write_quorum(spec)]


def derived_causes(spec: Spec, node: Node) -> dict[str, str]:
    """The spec field each directive opsctl derives from the topology's shape comes from, with its value, so a plan
    names the change's cause (what the user edited), not the derived setting. A `config:` entry overrides the
    derivation: then the cause is that entry, as for any directive not listed here."""
    per_shard = replicas_per_shard(spec)
    if spec.topology == "cluster":
        field = "cluster.replicas_per_master"
    elif spec.topology == "standalone":
        field = "topology standalone"
    else:
        field = "replication.replicas" if spec.replication_or_default().replicas is not None else "hosts"
    shape = f"{field} ({per_shard} {'replica' if per_shard == 1 else 'replicas'} per master)"
    causes = dict.fromkeys(("repl-diskless-sync-delay", "repl-diskless-sync-max-replicas"), shape)
    if spec.persistence.min_replicas_to_write is None:
        causes["min-replicas-to-write"] = "topology cluster" if spec.topology == "cluster" else shape
    overridden = {**spec.config, **dict(node.config)}
    return {name: cause for name, cause in causes.items() if name not in overridden}


def sentinel_causes(spec: Spec) -> dict[str, str]:
    """A sentinel's derived setting, as derived_causes: its quorum, a majority of the sentinels unless set."""
    topo = spec.sentinel_or_default()
    if topo.quorum:
        return {}
    count = len(sentinel_hosts(spec))
    return {"quorum": f"{'sentinel.hosts' if topo.hosts is not None else 'hosts'} ({count} sentinels: a majority)"}


def write_quorum(spec: Spec) -> list[Directive]:
    """min-replicas-to-write and -max-lag (persistence.min_replicas_*): a master refuses writes once fewer replicas
    than that acknowledged its stream within the lag, so a cut-off master stops acknowledging writes a failover
    would drop. On by default where replication or Sentinel fail a master over, off in a cluster
    (docs/internals.md)."""
    if spec.topology == "standalone":
        return []
    persistence = spec.persistence
    to_write = persistence.min_replicas_to_write
    if to_write is None:
        to_write = 1 if spec.topology != "cluster" and replicas_per_shard(spec) > 0 else 0
    return [("min-replicas-to-write", str(to_write)), ("min-replicas-max-lag", str(persistence.min_replicas_max_lag))]


def cluster(spec: Spec, node: Node) -> list[Directive]:
    topo = spec.cluster_or_default()
    return [("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"),
            ("cluster-announce-ip", word(node.address)), *bus_port(node),
            ("cluster-node-timeout", str(topo.node_timeout_ms)),
            ("cluster-require-full-coverage", _yes(topo.require_full_coverage)),
            ("cluster-allow-replica-migration", "no"),
            ("cluster-replica-validity-factor", str(topo.replica_validity_factor)),
            ("cluster-allow-reads-when-down", _yes(topo.allow_reads_when_down)), *slot_stats(spec, node)]


def slot_stats(spec: Spec, node: Node) -> list[Directive]:
    """cluster.slot_stats, unless the config spells cluster-slot-stats-enabled out (which it renders itself)."""
    spelled = {**spec.config, **dict(node.config)}
    on = spec.cluster_or_default().slot_stats and "cluster-slot-stats-enabled" not in spelled
    return [("cluster-slot-stats-enabled", "yes")] if on else []


def bus_port(node: Node) -> list[Directive]:
    """cluster-port where the bus is not at the servers' own port + 10000 (the default renders as it always did)."""
    return [("cluster-port", str(node.bus_port))] if node.names_bus_port else []


def monitoring() -> list[Directive]:
    return [("slowlog-log-slower-than", "10000"), ("slowlog-max-len", "1024"),
            ("latency-monitor-threshold", "100")]


def extra(spec: Spec, node: Node) -> list[Directive]:
    merged = {**spec.config, **dict(node.config)}
    return [(name, config_text(value) or '""') for name, value in sorted(merged.items())]


def server_sections(loaded: LoadedSpec, node: Node, paths: NodePaths, password: str,
                    daemonize: bool) -> tuple[Section, ...]:
    spec = loaded.spec
    sections = [
        Section("network", supported(spec, network(spec, node))),
        Section("process", supported(spec, process(node, paths, daemonize))),
        Section("security", supported(spec, security(loaded, paths, password))),
        Section("dangerous commands", tuple(renames(loaded))),
        Section("persistence", supported(spec, persistence(spec))),
        Section("memory", supported(spec, memory(spec))),
        Section("replication", supported(spec, replication(spec))),
        Section("slow queries and latency", supported(spec, monitoring())),
    ]
    if spec.topology == "cluster":
        sections.append(Section("cluster", supported(spec, cluster(spec, node))))
    if spec.tls.enabled:
        sections.append(Section("tls", tuple(tls(spec, paths))))
    held = maintenance(spec, node)
    return with_overrides(sections, [*(d for d in extra(spec, node) if d[0] not in dict(held)), *held])


def maintenance(spec: Spec, node: Node) -> list[Directive]:
    """A server on a host marked maintenance is never promoted by Sentinel or by its cluster's own failover: a
    graceful failover opsctl runs still picks its target (opsctl.plan.rolling)."""
    host = next((h for h in spec.hosts if h.name == node.host), None)
    if host is None or not host.maintenance:
        return []
    return [("cluster-replica-no-failover", "yes")] if spec.topology == "cluster" else [("replica-priority", "0")]


def with_overrides(sections: list[Section], overrides: list[Directive]) -> tuple[Section, ...]:
    """The spec's config: a directive opsctl already renders takes the new value in place (one line per
    directive, so drift checks see it); the rest go into an extra section."""
    values = dict(overrides)
    rendered = {name for section in sections for name, _ in section.directives}
    result = [Section(sec.title, tuple((name, values.get(name, value)) for name, value in sec.directives))
              for sec in sections]
    added = tuple((name, value) for name, value in overrides if name not in rendered)
    if added:
        result.append(Section("extra (spec config)", added))
    return tuple(result)


def sentinel_sections(loaded: LoadedSpec, node: Node, paths: NodePaths, master: tuple[str, int],
                      password: str, daemonize: bool) -> tuple[Section, ...]:
    spec = loaded.spec
    topo = spec.sentinel_or_default()
    name = sentinel_master_name(spec)
    monitor: list[Directive] = [
        ("sentinel monitor", f"{name} {word(master[0])} {master[1]} {sentinel_quorum(spec)}"),
        ("sentinel down-after-milliseconds", f"{name} {topo.down_after_ms}"),
        ("sentinel failover-timeout", f"{name} {topo.failover_timeout_ms}"),
        ("sentinel parallel-syncs", f"{name} {topo.parallel_syncs}"),
        ("sentinel auth-pass", f"{name} {quoted(password)}"),
    ]
    if spec.auth.mode == "acl":
        monitor.append(("sentinel auth-user", f"{name} {word(spec.auth.admin_user)}"))
    monitor += [("sentinel rename-command", f"{name} {word(c)} {word(new)}")
                for c, new in sorted(loaded.renames.items())]
    own: list[Directive] = [("requirepass", quoted(password)), ("sentinel sentinel-pass", quoted(password))]
    sections = (
        Section("network", (("bind", _bind(node)), *source_address(spec, node), *ports(spec, node),
                            ("protected-mode", "yes"),
                            ("sentinel announce-ip", word(node.address)), ("sentinel announce-port", str(node.port)))),
        Section("process", (("daemonize", _yes(daemonize)), ("pidfile", word(paths.pid)),
                            ("logfile", word(paths.log)), ("dir", word(paths.dir)))),
        Section("security", (*own, ("sentinel deny-scripts-reconfig", "yes"),
                             ("sentinel resolve-hostnames", "no"))),
        Section("monitored master", tuple(monitor)),
    )
    return (*sections, Section("tls", tuple(tls(spec, paths, sentinel=True)))) if spec.tls.enabled else sections
