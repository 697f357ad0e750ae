"""What a valid spec is: the pydantic models that validate a spec's fields (opsctl.spec.checks checks across
them) and give its defaults and its JSON Schema. Field names are part of the user contract. A validated spec is
handed on as opsctl.spec.model's plain values, which have the same classes, fields and defaults."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, StringConstraints, model_validator

from opsctl.base.errors import echo

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")]
Port = Annotated[int, Field(ge=1, le=65535)]


def _size_text(value: object) -> object:
    """A size may be written as a plain byte count (maxmemory: 1048576)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


SIZE_PATTERN = r"^[0-9]+([bB]|[kKmMgG][bB]?)?$"
Size = Annotated[str, BeforeValidator(_size_text, json_schema_input_type=Annotated[
                     str, StringConstraints(pattern=SIZE_PATTERN)] | Annotated[int, Field(ge=0)]),
                 StringConstraints(pattern=r"^[0-9]+(b|k|kb|m|mb|g|gb)?$", to_lower=True)]


def _config_value(value: object) -> str | int | bool:
    if isinstance(value, (str, int, bool)) and not isinstance(value, float):
        return value
    raise ValueError(f"must be a string, a whole number or true/false, got {echo(value)} (quote other values)")


ConfigValue = Annotated[str | int | bool, PlainValidator(_config_value)]
ConfigMap = dict[str, ConfigValue]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SecretRef(Strict):
    """Where a secret lives: an environment variable or a file. Never the value itself."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")
        return self


class FileRef(Strict):
    """A file on the machine running opsctl (relative paths: next to the spec)."""

    file: Annotated[str, StringConstraints(min_length=1)]


class TlsFiles(Strict):
    """Certificate files for one host or one node (override tls.ca / tls.cert / tls.key)."""

    ca: FileRef | None = None
    cert: FileRef | None = None
    key: FileRef | None = None


TlsProtocol = Literal["TLSv1.2", "TLSv1.3"]


def _default_protocols() -> list[TlsProtocol]:
    return ["TLSv1.2", "TLSv1.3"]


class Tls(Strict):
    """TLS for clients, replication, the cluster bus, Sentinel and opsctl itself; see docs/tls.md."""

    enabled: bool = False
    generate: bool = Field(default=False, description=(
        "opsctl makes a private CA and one certificate per node (SANs: address and host name) in the state dir"))
    ca: FileRef | None = None
    cert: FileRef | None = None
    key: FileRef | None = None
    client_auth: Literal["required", "optional", "no"] = "required"
    protocols: Annotated[list[TlsProtocol], Field(min_length=1)] = Field(default_factory=_default_protocols)
    plaintext_port: bool = Field(default=False, description=(
        "also listen without TLS on the node's port + 1000 (a migration aid; off by default)"))

    @model_validator(mode="after")
    def _files_or_generate(self) -> Tls:
        if self.generate and (self.ca or self.cert or self.key):
            raise ValueError("give either generate: true or ca/cert/key files, not both")
        return self


class Server(Strict):
    flavor: Literal["valkey", "redis"] = "valkey"
    version: Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+$")] = "9.1"
    binary: str | None = Field(default=None, description=(
        "the server's executable on the machine running opsctl (relative paths: next to the spec)"))
    user: Name | None = Field(default=None, description=(
        "OS user the servers run as (never root): provider local uses it when opsctl runs as root, provider "
        "ansible always; created when missing. Default: the flavor's name (valkey or redis)"))

    @model_validator(mode="after")
    def _never_root(self) -> Server:
        if self.binary is not None and (self.binary == "" or self.binary != self.binary.strip()):
            raise ValueError(f"binary: {self.binary!r} is not a path: give the server's executable without spaces "
                             "around it (relative paths: next to the spec), or leave binary out to find one")
        if self.user == "root":
            raise ValueError("user: servers never run as root; name an unprivileged user (default: the flavor's name)")
        return self


# A login name as useradd takes it; ssh and Ansible get it in argv and inventories, so nothing else is allowed.
LOGIN_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
Login = Annotated[str, StringConstraints(pattern=f"^{LOGIN_PATTERN}$")]
# [user@]address[:port] (a bracketed IPv6 address may carry a port) or the name of a host of the spec.
Bastion = Annotated[str, StringConstraints(
    pattern=rf"^({LOGIN_PATTERN}@)?([A-Za-z0-9][A-Za-z0-9.-]{{0,252}}|\[[0-9A-Fa-f:.]{{2,45}}\])(:[0-9]{{1,5}})?$")]


class Host(Strict):
    name: Name
    address: str
    bind: list[str] | None = None
    ssh_user: Login | None = None
    ssh_key: str | None = None
    ssh_port: Port = 22
    bastion: Bastion | None = None
    admin_via_ssh: bool = Field(default=False, description=(
        "provider ansible: opsctl reaches this host's node ports through an SSH tunnel to the host "
        "(for ports open only to the other hosts); see docs/remote.md"))
    tls: TlsFiles | None = None


class NodeOverride(Strict):
    port: Port | None = None
    config: ConfigMap = Field(default_factory=dict)
    tls: TlsFiles | None = None


class ClusterTopology(Strict):
    masters: Annotated[int, Field(ge=3, le=500)] = 3
    replicas_per_master: Annotated[int, Field(ge=0, le=5)] = 1
    base_port: Port = 7101
    node_timeout_ms: Annotated[int, Field(ge=500, le=600000)] = 5000
    require_full_coverage: bool = True
    replica_validity_factor: Annotated[int, Field(ge=1, le=100)] = 10
    allow_reads_when_down: bool = False


class StandaloneTopology(Strict):
    host: str | None = None
    port: Port = 7001


class ReplicationTopology(Strict):
    master: str | None = None
    replicas: list[str] | None = None
    base_port: Port = 7201


class SentinelTopology(Strict):
    hosts: list[str] | None = None
    port: Port = 27001
    quorum: Annotated[int, Field(ge=1)] | None = None
    master_name: Name | None = None
    down_after_ms: Annotated[int, Field(ge=100)] = 5000
    failover_timeout_ms: Annotated[int, Field(ge=1000)] = 60000
    parallel_syncs: Annotated[int, Field(ge=1)] = 1


class AclUser(Strict):
    name: Name
    password: SecretRef
    previous_password: SecretRef | None = None  # accepted too until removed: a rotation's overlap
    rules: str = "~* &* +@all -@dangerous"


class Auth(Strict):
    mode: Literal["password", "acl"] = "password"
    password: SecretRef
    previous_password: SecretRef | None = None  # set while rotating: the password the nodes run with now
    admin_user: Name = "opsctl"
    users: list[AclUser] = Field(default_factory=list)


class Hardening(Strict):
    disabled_commands: list[str] = Field(default_factory=lambda: ["FLUSHALL", "FLUSHDB", "KEYS"])
    renamed_commands: dict[str, str] = Field(default_factory=dict)
    rename_takeover_commands: bool = Field(default=True, description=(
        "password mode: run ACL, CONFIG, FAILOVER, MIGRATE, REPLICAOF, SHUTDOWN and SLAVEOF under names opsctl "
        "derives (see README, 'Renamed commands'); ACL mode is the recommended way to restrict clients"))
    rename_key: SecretRef | None = Field(default=None, description=(
        "a secret the derived command names are keyed by; without it they are derived from the spec's name"))
    allow_default_port: bool = False
    allow_public_bind: bool = False
    allow_unsafe: bool = False


class Persistence(Strict):
    aof: Literal["always", "everysec", "no", "off"] = "everysec"
    rdb: list[str] = Field(default_factory=lambda: ["900 1", "300 10", "60 10000"])


class Memory(Strict):
    maxmemory: Size = "256mb"
    policy: str = "volatile-lru"


class Spec(Strict):
    name: Name
    topology: Literal["standalone", "replication", "sentinel", "cluster"]
    server: Server = Field(default_factory=Server)
    provider: Literal["local", "ansible"] = "local"
    hosts: Annotated[list[Host], Field(min_length=1)]
    cluster: ClusterTopology | None = None
    standalone: StandaloneTopology | None = None
    replication: ReplicationTopology | None = None
    sentinel: SentinelTopology | None = None
    auth: Auth
    hardening: Hardening = Field(default_factory=Hardening)
    persistence: Persistence = Field(default_factory=Persistence)
    memory: Memory = Field(default_factory=Memory)
    lazyfree: bool = True
    tls: Tls = Field(default_factory=Tls)
    config: ConfigMap = Field(default_factory=dict)
    nodes: dict[str, NodeOverride] = Field(default_factory=dict)
