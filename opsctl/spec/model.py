"""The topology spec, declared once as frozen plain values: each field's type, constraints (opsctl.base.record's
markers), default and meaning; a class's check() is its rule across fields. Field names are part of the user
contract. Plain values because a validated spec is handed on without pydantic (docs/internals.md).
"""

import typing
from typing import Annotated, Literal

from opsctl.base.record import Check, Hidden, Length, Pattern, Range, Record, field
from opsctl.base.record import fields_of as _fields_of  # noqa: F401 (tests/test_spec_cache.py reads fields here)

Topology = Literal["standalone", "replication", "sentinel", "cluster"]
TOPOLOGIES: tuple[str, ...] = typing.get_args(Topology)
POLICIES = ("volatile-lru", "allkeys-lru", "volatile-lfu", "allkeys-lfu",
            "volatile-random", "allkeys-random", "volatile-ttl", "noeviction")

LAZYFREE = ("lazyfree-lazy-eviction", "lazyfree-lazy-expire", "lazyfree-lazy-server-del",
            "lazyfree-lazy-user-del", "replica-lazy-flush")  # what lazyfree: true turns on
# Directives whose value is a secret: an error about config: or nodes.<name>.config: never quotes it.
SECRET_CONFIG = frozenset({"requirepass", "masterauth", "primaryauth", "tls-key-file-pass", "tls-client-key-file-pass"})
PLAINTEXT_PORT_OFFSET = 1000  # tls.plaintext_port: the plaintext port is the node's port + this
CLUSTER_BUS_OFFSET = 10000  # cluster.bus_port_offset's default: the servers' own (a node's bus port is its port + this)

TlsProtocol = Literal["TLSv1.2", "TLSv1.3"]
Name = Annotated[str, Pattern(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")]
Port = Annotated[int, Range(1, 65535)]
Size = Annotated[str, Check("size")]  # 256mb, 2gb, a byte count (kept lower-case, a number as text)
ConfigValue = Annotated[str | int | bool, Check("config value")]
# A login name as useradd takes it; ssh and Ansible get it in argv and inventories, so nothing else is allowed.
LOGIN_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
Login = Annotated[str, Pattern(f"^{LOGIN_PATTERN}$")]
# [user@]address[:port] (a bracketed IPv6 address may carry a port) or the name of a host of the spec.
Bastion = Annotated[str, Pattern(
    rf"^({LOGIN_PATTERN}@)?([A-Za-z0-9][A-Za-z0-9.-]{{0,252}}|\[[0-9A-Fa-f:.]{{2,45}}\])(:[0-9]{{1,5}})?$")]


# An environment variable's name as a shell exports it: a secret pasted in its place fails this, unquoted.
EnvName = Annotated[str, Pattern(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")]


def config_text(value: ConfigValue) -> str:
    """A config value as a server's file writes it (true/false as yes/no)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


class SecretRef(Record):
    """Where a secret lives: an environment variable or a file. Never the value itself."""

    SECRET = True
    env: EnvName | None = field(None, description="the environment variable that holds the secret")
    file: str | None = field(None, description=(
        "the file that holds only the secret, mode 0600 (relative paths: next to the spec)"))

    def check(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")

    def describe(self) -> str:
        return f"environment variable {self.env}" if self.env else f"file {self.file}"


class FileRef(Record):
    """A file on the machine running opsctl (relative paths: next to the spec)."""

    file: Annotated[str, Length(1)] = field(description="the file's path (relative paths: next to the spec)")


KeyFile = Annotated[FileRef, Hidden()]  # a private key's file: a key pasted in its place is never quoted back


class TlsFiles(Record):
    """Certificate files for one host or one node (override tls.ca / tls.cert / tls.key)."""

    ca: FileRef | None = field(None, description="the CA bundle these nodes trust, over tls.ca")
    cert: FileRef | None = field(None, description="these nodes' certificate (PEM), over tls.cert")
    key: KeyFile | None = field(None, description="the file of these nodes' private key (PEM), over tls.key")


class Tls(Record):
    """TLS for clients, replication, the cluster bus, Sentinel and opsctl itself; see docs/tls.md."""

    enabled: bool = field(False, description=(
        "every node speaks TLS only (port 0 plus tls-port), to clients, replicas, the cluster bus, Sentinel and "
        "opsctl; certificates from generate or from ca/cert/key"))
    generate: bool = field(False, description=(
        "opsctl makes a private CA and one certificate per node (SANs: address and host name) in the state dir"))
    ca: FileRef | None = field(None, description=(
        "the CA bundle the nodes and opsctl trust, for every node (hosts[].tls and nodes.<name>.tls override it)"))
    cert: FileRef | None = field(None, description="the nodes' certificate (PEM), for every node unless overridden")
    key: KeyFile | None = field(None, description=(
        "the file of the nodes' private key (PEM), for every node unless overridden"))
    client_auth: Literal["required", "optional", "no"] = field("required", description=(
        "tls-auth-clients: required, a client needs a certificate the CA signed; optional, checked when given; "
        "no, not asked for"))
    protocols: Annotated[list[TlsProtocol], Length(1)] = field(default_factory=lambda: ["TLSv1.2", "TLSv1.3"],
                                                               description="tls-protocols: the TLS versions accepted")
    plaintext_port: bool = field(False, description=(
        "also listen without TLS on the node's port + 1000 (a migration aid; off by default)"))

    def check(self) -> None:
        if self.generate and (self.ca or self.cert or self.key):
            raise ValueError("give either generate: true or ca/cert/key files, not both")


class Server(Record):
    flavor: Literal["valkey", "redis"] = field("valkey", description="which server the nodes run: valkey or redis")
    version: Annotated[str, Pattern(r"^[0-9]+\.[0-9]+$")] = field("9.1", description=(
        "the server's major.minor version, quoted (e.g. \"9.1\"); validate names the supported ones"))
    binary: str | None = field(None, description=(
        "the server's executable on the machine running opsctl (relative paths: next to the spec)"))
    user: Name | None = field(None, description=(
        "OS user the servers run as (never root): provider local uses it when opsctl runs as root, provider "
        "ansible always; created when missing. Default: the flavor's name (valkey or redis)"))

    def check(self) -> None:
        if self.binary is not None and (self.binary == "" or self.binary != self.binary.strip()):
            raise ValueError(f"binary: {self.binary!r} is not a path: give the server's executable without spaces "
                             "around it (relative paths: next to the spec), or leave binary out to find one")
        if self.user == "root":
            raise ValueError("user: servers never run as root; name an unprivileged user (default: the flavor's name)")

    @property
    def service_user(self) -> str:
        return self.user or self.flavor


class Host(Record):
    name: Name = field(description="the host's name in this spec (placement, sections and node overrides use it)")
    address: str = field(description=(
        "where the host's nodes are reached (and, with provider ansible, the host over SSH); provider local: "
        "a loopback address such as 127.0.0.2"))
    bind: list[str] | None = field(None, description=(
        "the addresses the host's nodes listen on; default: address only (every interface needs "
        "hardening.allow_public_bind)"))
    ssh_user: Login | None = field(None, description="provider ansible: the login on this host over SSH")
    ssh_key: str | None = field(None, description=(
        "provider ansible: the SSH private key file on the machine running opsctl; default: ssh's own"))
    ssh_port: Port = field(22, description="provider ansible: the host's SSH port")
    bastion: Bastion | None = field(None, description=(
        "provider ansible: the jump host SSH goes through, [user@]address[:port] or the name of another host"))
    admin_via_ssh: bool = field(False, description=(
        "provider ansible: opsctl reaches this host's node ports through an SSH tunnel to the host "
        "(for ports open only to the other hosts); see docs/remote.md"))
    tls: TlsFiles | None = field(None, description="certificate files for this host's nodes, over tls.ca/cert/key")
    source_address: str | None = field(None, description=(
        "bind-source-addr of the servers and sentinels on this host: the address their outgoing connections "
        "(replication, Sentinel, cluster bus) leave from, the host's address or one of its bind addresses; "
        "default: the kernel's choice (Redis >= 7.0, Valkey)"))
    maintenance: bool = field(False, description=(
        "the host keeps its nodes but serves no master: apply fails its masters over gracefully to members on other "
        "hosts, and its replicas are never promoted (replica-priority 0; in a cluster cluster-replica-no-failover), "
        "until the mark is removed (docs/changing-the-fleet.md)"))


class NodeOverride(Record):
    port: Port | None = field(None, description="the node's port instead of the one its section derives")
    config: dict[str, ConfigValue] = field(default_factory=dict, description=(
        "directives for this node only, over the spec's config (same rules)"))
    tls: TlsFiles | None = field(None, description="certificate files for this node, over hosts[].tls and tls")


class ClusterTopology(Record):
    masters: Annotated[int, Range(3, 500)] = field(3, description=(
        "the number of shards; change it and apply to scale out (slots move to new shards) or in (drained first)"))
    replicas_per_master: Annotated[int, Range(0, 5)] = field(1, description=(
        "replicas of each master, each on a host other than its master's and its shard's other replicas'"))
    base_port: Port = field(7101, description=(
        "node k (<name>-k) listens on base_port + k - 1, its cluster bus on that port + bus_port_offset"))
    bus_port_offset: Annotated[int, Range(1, 65534)] = field(CLUSTER_BUS_OFFSET, description=(
        "cluster-port: each node's cluster bus port is its port + this, at most 65535, free on its host and open "
        "between the hosts (docs/remote.md); apply changes it by restarting the nodes one at a time, and refuses "
        "a change that puts a node's bus port on one another node at its address holds until its own restart"))
    node_timeout_ms: Annotated[int, Range(500, 600000)] = field(5000, description=(
        "cluster-node-timeout: how long a node may not answer before the cluster counts it as failing"))
    require_full_coverage: bool = field(True, description=(
        "cluster-require-full-coverage: the cluster refuses queries while any slot has no serving master"))
    replica_validity_factor: Annotated[int, Range(1, 100)] = field(10, description=(
        "cluster-replica-validity-factor: a replica cut off from its master longer than this times the node "
        "timeout does not fail over"))
    allow_reads_when_down: bool = field(False, description=(
        "cluster-allow-reads-when-down: nodes still answer reads while the cluster is down"))
    slot_stats: bool = field(False, description=(
        "cluster-slot-stats-enabled (Valkey 8.0 and later): the nodes count CPU time and network bytes per slot "
        "(CLUSTER SLOT-STATS), which `opsctl cluster rebalance --by cpu|network` measures; apply sets it live"))
    rebalance_placement: bool = field(False, description=(
        "apply moves existing members onto the least-loaded hosts (an added host, say) until members per host "
        "differ by at most one, each by a new replica there, synced, a master failed over first, then the old "
        "member retired; `opsctl cluster rebalance --placement` does it once (docs/changing-the-fleet.md)"))


class StandaloneTopology(Record):
    host: str | None = field(None, description="the host the server runs on; default: the first host")
    port: Port = field(7001, description="the server's port")


class ReplicationTopology(Record):
    master: str | None = field(None, description="the host the master starts on; default: the first host")
    replicas: list[str] | None = field(None, description=(
        "the hosts of the replicas, one each, none the master's; default: every other host"))
    base_port: Port = field(7201, description="the master's port; the i-th replica listens on base_port + i")


class SentinelTopology(Record):
    hosts: list[str] | None = field(None, description=(
        "the hosts that run a Sentinel, at least 3 distinct ones; default: every host"))
    port: Port = field(27001, description="the port of every Sentinel")
    quorum: Annotated[int, Range(ge=1)] | None = field(None, description=(
        "how many Sentinels must agree the master is down; default: a majority of them"))
    master_name: Name | None = field(None, description=(
        "the name the Sentinels monitor the master under; default: the spec's name"))
    down_after_ms: Annotated[int, Range(ge=100)] = field(5000, description=(
        "sentinel down-after-milliseconds: how long the master may not answer before a Sentinel thinks it down"))
    failover_timeout_ms: Annotated[int, Range(ge=1000)] = field(60000, description=(
        "sentinel failover-timeout: how long a failover may take before it is tried again"))
    parallel_syncs: Annotated[int, Range(ge=1)] = field(1, description=(
        "sentinel parallel-syncs: how many replicas resynchronise with a new master at once after a failover"))


class AclUser(Record):
    name: Name = field(description="the user's name (not default, not auth.admin_user)")
    password: SecretRef = field(description="where the user's password lives: {env: VAR} or {file: PATH}")
    previous_password: SecretRef | None = field(None, description=(
        "during a rotation, the user's old password, accepted too until removed"))
    rules: str = field("~* &* +@all -@dangerous", description=(
        "the user's ACL rules (keys, channels, commands); never a password, nopass, reset or resetpass"))


class Auth(Record):
    mode: Literal["password", "acl"] = field("password", description=(
        "password: one password for every client (requirepass); acl (recommended): a users file, the default "
        "user off, opsctl's own admin user"))
    password: SecretRef = field(description=(
        "where the password lives, {env: VAR} or {file: PATH}, never the value: every client's in password "
        "mode, opsctl's admin user's in acl mode; replication and Sentinel use it too"))
    previous_password: SecretRef | None = field(None, description=(
        "during a rotation, the password the nodes run with now, accepted too until removed (docs/rotation.md)"))
    admin_user: Name = field("opsctl", description=(
        "acl mode: the user opsctl, replicas (masteruser) and Sentinels log in as; never default"))
    users: list[AclUser] = field(default_factory=list, description="acl mode: the applications' users")


class Hardening(Record):
    disabled_commands: list[str] = field(default_factory=lambda: ["FLUSHALL", "FLUSHDB", "KEYS"], description=(
        "commands no client can run: renamed to \"\" on every server and denied to ACL users"))
    renamed_commands: dict[str, str] = field(default_factory=dict, description=(
        "command -> the name the servers run it under (4 to 64 letters, digits or _); opsctl uses the new name"))
    rename_takeover_commands: bool = field(True, description=(
        "password mode: run ACL, CONFIG, FAILOVER, MIGRATE, REPLICAOF, SHUTDOWN and SLAVEOF under names opsctl "
        "derives (see README, 'Renamed commands'); ACL mode is the recommended way to restrict clients"))
    rename_key: SecretRef | None = field(None, description=(
        "a secret the derived command names are keyed by; without it they are derived from the spec's name"))
    allow_default_port: bool = field(False, description="allow the default ports 6379 and 26379")
    allow_public_bind: bool = field(False, description=(
        "allow a host's address or bind to be every interface (0.0.0.0, ::, *)"))
    allow_unsafe: bool = field(False, description=(
        "allow config values that undo hardening (protected-mode no, module loading, ...) and unsafe ACL rules"))


class Persistence(Record):
    aof: Literal["always", "everysec", "no", "off"] = field("everysec", description=(
        "the append-only file's fsync (appendfsync always, everysec or no); off: no AOF"))
    rdb: list[str] = field(default_factory=lambda: ["900 1", "300 10", "60 10000"], description=(
        "RDB snapshot rules, each \"<seconds> <changes>\" (save); [] turns snapshots off"))
    min_replicas_to_write: Annotated[int, Range(0, 100)] | None = field(None, description=(
        "a master refuses writes (NOREPLICAS) while fewer of its replicas than this acknowledged its stream within "
        "min_replicas_max_lag seconds: bounds the writes a master cut off from its replicas acknowledges and a "
        "failover then drops. Default: 1 in replication and sentinel topologies with replicas, 0 in a cluster "
        "(its node timeout bounds a cut-off master); 0 turns it off (docs/runbooks/partitions.md)"))
    min_replicas_max_lag: Annotated[int, Range(1, 3600)] = field(5, description=(
        "seconds since a replica's last acknowledgement after which it no longer counts for "
        "min_replicas_to_write: a master cut off from its replicas stops taking writes within about this + 2 s"))


class Memory(Record):
    maxmemory: Size = field("256mb", description="each server's memory limit (maxmemory): 256mb, 2gb, a byte count")
    policy: str = field("volatile-lru", description="maxmemory-policy: what goes when the limit is reached")


class Metrics(Record):
    exporter: bool = field(False, description=(
        "run one redis_exporter (Debian prometheus-redis-exporter) beside each server and Sentinel, logged in as its "
        "own least-privilege ACL user (docs/monitoring.md)"))
    port_offset: Annotated[int, Range(1, 64534)] = field(1000, description=(
        "each exporter listens on its node's address at the node's port + this (opsctl metrics targets lists them)"))


# The source's ACL user: a name the source's servers took (any AUTH word without a blank or a control character).
SourceUser = Annotated[str, Pattern(r"^[A-Za-z0-9_][A-Za-z0-9_.@:-]{0,63}$")]


class FollowsTls(Record):
    """How the standby's link speaks TLS to a primary given by endpoints."""

    ca: FileRef = field(description="the CA bundle the primary's certificates chain to")
    cert: FileRef | None = field(None, description=(
        "opsctl's client certificate, for a primary that asks for one (tls-auth-clients)"))
    key: KeyFile | None = field(None, description="the file of that certificate's private key (PEM)")

    def check(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("give cert and key together, or neither")


class Follows(Record):
    """This topology is a standby of another (docs/standby.md): `opsctl follow` copies and streams the primary's
    writes into it, and it refuses its clients' writes until `opsctl switchover`."""

    spec: Annotated[str, Length(1)] | None = field(None, description=(
        "the primary's spec, a topology opsctl runs (relative paths: next to this spec)"))
    endpoints: Annotated[list[str], Length(1)] | None = field(None, description=(
        "instead of spec: a primary opsctl does not run, by one or more of its servers' HOST:PORT"))
    user: SourceUser | None = field(None, description="with endpoints: the primary's ACL user (default: none)")
    password: SecretRef | None = field(None, description=(
        "with endpoints: where the primary's password lives, {env: VAR} or {file: PATH}"))
    tls: FollowsTls | None = field(None, description="with endpoints: the primary speaks TLS")

    def check(self) -> None:
        if (self.spec is None) == (self.endpoints is None):
            raise ValueError("give exactly one of spec (a primary opsctl runs) or endpoints (one it does not)")
        if self.spec is not None and (self.user or self.password or self.tls):
            raise ValueError("user, password and tls go with endpoints: a primary's spec names its own")
        if self.endpoints is not None and self.password is None:
            raise ValueError("endpoints need password: {env: VAR} or {file: PATH} (the primary's password)")


class Spec(Record):
    name: Name = field(description=(
        "the topology's name: it names the nodes (<name>-1, ...), the state dir and the inventory groups"))
    topology: Topology = field(description="standalone, replication, sentinel (replication plus Sentinels) or cluster")
    server: Server = field(default_factory=Server, description="the server the nodes run")
    provider: Literal["local", "ansible"] = field("local", description=(
        "local: processes on this machine; ansible: hosts over SSH (docs/remote.md)"))
    hosts: Annotated[list[Host], Length(1)] = field(description="the machines the nodes are placed on")
    cluster: ClusterTopology | None = field(None, description="topology cluster: shards, replicas and ports")
    standalone: StandaloneTopology | None = field(None, description="topology standalone: the one server")
    replication: ReplicationTopology | None = field(None, description=(
        "topology replication or sentinel: the master and its replicas"))
    sentinel: SentinelTopology | None = field(None, description="topology sentinel: the Sentinels")
    auth: Auth = field(description="how clients, replicas, Sentinels and opsctl authenticate")
    hardening: Hardening = field(default_factory=Hardening, description=(
        "disabled and renamed commands, and the safety checks a spec may waive"))
    persistence: Persistence = field(default_factory=Persistence, description="AOF and RDB snapshots")
    memory: Memory = field(default_factory=Memory, description="the memory limit and what goes when it is reached")
    lazyfree: bool = field(True, description=(
        "free memory in the background: the lazyfree-lazy-* directives and replica-lazy-flush"))
    tls: Tls = field(default_factory=Tls, description="TLS for every connection (docs/tls.md)")
    config: dict[str, ConfigValue] = field(default_factory=dict, description=(
        "extra directives for every server; none opsctl sets from another field, none that undoes hardening "
        "without allow_unsafe"))
    nodes: dict[str, NodeOverride] = field(default_factory=dict, description=(
        "per-node overrides by node name, e.g. {orders-4: {port: 7204, config: {hz: 20}}}"))
    metrics: Metrics = field(default_factory=Metrics, description=(
        "Prometheus: the redis_exporters beside the nodes (docs/monitoring.md)"))
    follows: Follows | None = field(None, description=(
        "this topology is a standby of the one named here: it refuses client writes while `opsctl follow` "
        "streams the primary's into it, until `opsctl switchover` (docs/standby.md)"))

    def cluster_or_default(self) -> ClusterTopology:
        return self.cluster or ClusterTopology()

    def standalone_or_default(self) -> StandaloneTopology:
        return self.standalone or StandaloneTopology()

    def replication_or_default(self) -> ReplicationTopology:
        return self.replication or ReplicationTopology()

    def sentinel_or_default(self) -> SentinelTopology:
        return self.sentinel or SentinelTopology()
