"""The topology spec, declared once: the classes every command works on, as frozen plain values. Field names are
part of the user contract.

Each field is declared here once: its type, its constraints (Annotated markers of opsctl.spec.record), its default
and what it means; a class's check() is its rule across fields. opsctl.spec.pydantic_model derives the pydantic
models that validate a spec and give its JSON Schema from these classes, and opsctl.spec.checks checks across
them. A validated spec is handed on as these values; they import no pydantic, so a run that finds its spec
already validated (opsctl.state.speccache) starts without it.
"""

import typing
from typing import Annotated, Literal

from opsctl.spec.record import Check, Hidden, Length, Pattern, Range, Record, field
from opsctl.spec.record import fields_of as _fields_of  # noqa: F401 (tests/test_spec_cache.py reads fields here)

Topology = Literal["standalone", "replication", "sentinel", "cluster"]
TOPOLOGIES: tuple[str, ...] = typing.get_args(Topology)
POLICIES = ("volatile-lru", "allkeys-lru", "volatile-lfu", "allkeys-lfu",
            "volatile-random", "allkeys-random", "volatile-ttl", "noeviction")

LAZYFREE = ("lazyfree-lazy-eviction", "lazyfree-lazy-expire", "lazyfree-lazy-server-del",
            "lazyfree-lazy-user-del", "replica-lazy-flush")  # what lazyfree: true turns on
# Directives whose value is a secret: an error about config: or nodes.<name>.config: never quotes it.
SECRET_CONFIG = frozenset({"requirepass", "masterauth", "primaryauth", "tls-key-file-pass", "tls-client-key-file-pass"})
PLAINTEXT_PORT_OFFSET = 1000  # tls.plaintext_port: the plaintext port is the node's port + this
CLUSTER_BUS_OFFSET = 10000  # a cluster node's bus port is its port + this

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


def config_text(value: ConfigValue) -> str:
    """A config value as a server's file writes it (true/false as yes/no)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


class SecretRef(Record):
    """Where a secret lives: an environment variable or a file. Never the value itself."""

    SECRET = True
    env: str | None = None
    file: str | None = None

    def check(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")

    def describe(self) -> str:
        return f"environment variable {self.env}" if self.env else f"file {self.file}"


class FileRef(Record):
    """A file on the machine running opsctl (relative paths: next to the spec)."""

    file: Annotated[str, Length(1)]


KeyFile = Annotated[FileRef, Hidden()]  # a private key's file: a key pasted in its place is never quoted back


class TlsFiles(Record):
    """Certificate files for one host or one node (override tls.ca / tls.cert / tls.key)."""

    ca: FileRef | None = None
    cert: FileRef | None = None
    key: KeyFile | None = None


class Tls(Record):
    """TLS for clients, replication, the cluster bus, Sentinel and opsctl itself; see docs/tls.md."""

    enabled: bool = False
    generate: bool = field(False, description=(
        "opsctl makes a private CA and one certificate per node (SANs: address and host name) in the state dir"))
    ca: FileRef | None = None
    cert: FileRef | None = None
    key: KeyFile | None = None
    client_auth: Literal["required", "optional", "no"] = "required"
    protocols: Annotated[list[TlsProtocol], Length(1)] = field(default_factory=lambda: ["TLSv1.2", "TLSv1.3"])
    plaintext_port: bool = field(False, description=(
        "also listen without TLS on the node's port + 1000 (a migration aid; off by default)"))

    def check(self) -> None:
        if self.generate and (self.ca or self.cert or self.key):
            raise ValueError("give either generate: true or ca/cert/key files, not both")


class Server(Record):
    flavor: Literal["valkey", "redis"] = "valkey"
    version: Annotated[str, Pattern(r"^[0-9]+\.[0-9]+$")] = "9.1"
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
    name: Name
    address: str
    bind: list[str] | None = None
    ssh_user: Login | None = None
    ssh_key: str | None = None
    ssh_port: Port = 22
    bastion: Bastion | None = None
    admin_via_ssh: bool = field(False, description=(
        "provider ansible: opsctl reaches this host's node ports through an SSH tunnel to the host "
        "(for ports open only to the other hosts); see docs/remote.md"))
    tls: TlsFiles | None = None
    source_address: str | None = field(None, description=(
        "bind-source-addr of the servers and sentinels on this host: the address their outgoing connections "
        "(replication, Sentinel, cluster bus) leave from, the host's address or one of its bind addresses; "
        "default: the kernel's choice (Redis >= 7.0, Valkey)"))


class NodeOverride(Record):
    port: Port | None = None
    config: dict[str, ConfigValue] = field(default_factory=dict)
    tls: TlsFiles | None = None


class ClusterTopology(Record):
    masters: Annotated[int, Range(3, 500)] = 3
    replicas_per_master: Annotated[int, Range(0, 5)] = 1
    base_port: Port = 7101
    node_timeout_ms: Annotated[int, Range(500, 600000)] = 5000
    require_full_coverage: bool = True
    replica_validity_factor: Annotated[int, Range(1, 100)] = 10
    allow_reads_when_down: bool = False


class StandaloneTopology(Record):
    host: str | None = None
    port: Port = 7001


class ReplicationTopology(Record):
    master: str | None = None
    replicas: list[str] | None = None
    base_port: Port = 7201


class SentinelTopology(Record):
    hosts: list[str] | None = None
    port: Port = 27001
    quorum: Annotated[int, Range(ge=1)] | None = None
    master_name: Name | None = None
    down_after_ms: Annotated[int, Range(ge=100)] = 5000
    failover_timeout_ms: Annotated[int, Range(ge=1000)] = 60000
    parallel_syncs: Annotated[int, Range(ge=1)] = 1


class AclUser(Record):
    name: Name
    password: SecretRef
    previous_password: SecretRef | None = None  # accepted too until removed: a rotation's overlap
    rules: str = "~* &* +@all -@dangerous"


class Auth(Record):
    mode: Literal["password", "acl"] = "password"
    password: SecretRef
    previous_password: SecretRef | None = None  # set while rotating: the password the nodes run with now
    admin_user: Name = "opsctl"
    users: list[AclUser] = field(default_factory=list)


class Hardening(Record):
    disabled_commands: list[str] = field(default_factory=lambda: ["FLUSHALL", "FLUSHDB", "KEYS"])
    renamed_commands: dict[str, str] = field(default_factory=dict)
    rename_takeover_commands: bool = field(True, description=(
        "password mode: run ACL, CONFIG, FAILOVER, MIGRATE, REPLICAOF, SHUTDOWN and SLAVEOF under names opsctl "
        "derives (see README, 'Renamed commands'); ACL mode is the recommended way to restrict clients"))
    rename_key: SecretRef | None = field(None, description=(
        "a secret the derived command names are keyed by; without it they are derived from the spec's name"))
    allow_default_port: bool = False
    allow_public_bind: bool = False
    allow_unsafe: bool = False


class Persistence(Record):
    aof: Literal["always", "everysec", "no", "off"] = "everysec"
    rdb: list[str] = field(default_factory=lambda: ["900 1", "300 10", "60 10000"])
    min_replicas_to_write: Annotated[int, Range(0, 100)] | None = field(None, description=(
        "a master refuses writes (NOREPLICAS) while fewer of its replicas than this acknowledged its stream within "
        "min_replicas_max_lag seconds: bounds the writes a master cut off from its replicas acknowledges and a "
        "failover then drops. Default: 1 in replication and sentinel topologies with replicas, 0 in a cluster "
        "(its node timeout bounds a cut-off master); 0 turns it off (docs/runbooks/partitions.md)"))
    min_replicas_max_lag: Annotated[int, Range(1, 3600)] = field(5, description=(
        "seconds since a replica's last acknowledgement after which it no longer counts for "
        "min_replicas_to_write: a master cut off from its replicas stops taking writes within about this + 2 s"))


class Memory(Record):
    maxmemory: Size = "256mb"
    policy: str = "volatile-lru"


class Spec(Record):
    name: Name
    topology: Topology
    server: Server = field(default_factory=Server)
    provider: Literal["local", "ansible"] = "local"
    hosts: Annotated[list[Host], Length(1)]
    cluster: ClusterTopology | None = None
    standalone: StandaloneTopology | None = None
    replication: ReplicationTopology | None = None
    sentinel: SentinelTopology | None = None
    auth: Auth
    hardening: Hardening = field(default_factory=Hardening)
    persistence: Persistence = field(default_factory=Persistence)
    memory: Memory = field(default_factory=Memory)
    lazyfree: bool = True
    tls: Tls = field(default_factory=Tls)
    config: dict[str, ConfigValue] = field(default_factory=dict)
    nodes: dict[str, NodeOverride] = field(default_factory=dict)

    def cluster_or_default(self) -> ClusterTopology:
        return self.cluster or ClusterTopology()

    def standalone_or_default(self) -> StandaloneTopology:
        return self.standalone or StandaloneTopology()

    def replication_or_default(self) -> ReplicationTopology:
        return self.replication or ReplicationTopology()

    def sentinel_or_default(self) -> SentinelTopology:
        return self.sentinel or SentinelTopology()
