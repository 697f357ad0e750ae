"""The topology spec as frozen, validated data: what every command works on. Field names are part of the user
contract.

What a valid spec is lives in opsctl.spec.pydantic_model (pydantic, with the checks of opsctl.spec.checks on
top); a validated spec is handed on as these plain values, made from its JSON form. They import no pydantic, so a
run that finds its spec already validated (opsctl.state.speccache) starts without it. Each class has the fields of the
pydantic model of the same name, in the same order (tests/test_spec_model.py pins both, and the defaults).
"""

import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

TOPOLOGIES = ("standalone", "replication", "sentinel", "cluster")
POLICIES = ("volatile-lru", "allkeys-lru", "volatile-lfu", "allkeys-lfu",
            "volatile-random", "allkeys-random", "volatile-ttl", "noeviction")

LAZYFREE = ("lazyfree-lazy-eviction", "lazyfree-lazy-expire", "lazyfree-lazy-server-del",
            "lazyfree-lazy-user-del", "replica-lazy-flush")  # what lazyfree: true turns on
PLAINTEXT_PORT_OFFSET = 1000  # tls.plaintext_port: the plaintext port is the node's port + this
CLUSTER_BUS_OFFSET = 10000  # a cluster node's bus port is its port + this

Topology = Literal["standalone", "replication", "sentinel", "cluster"]
TlsProtocol = Literal["TLSv1.2", "TLSv1.3"]
ConfigValue = str | int | bool
R = TypeVar("R", bound="Record")


def config_text(value: ConfigValue) -> str:
    """A config value as a server's file writes it (true/false as yes/no)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


class DataMismatch(ValueError):
    """JSON that does not have a record's shape: the field path and what was wrong."""


class Record:
    """A frozen value with typed fields, made from JSON-like data that is checked field by field (types only: the
    values' rules are the validator's). Method names follow pydantic's, so call sites read the same either way."""

    DEFAULTS: ClassVar[Mapping[str, object]] = {}
    _fields: ClassVar[dict[str, object]]  # field -> its type, in declaration order

    def __init__(self, **values: object) -> None:
        fields = _fields_of(type(self))
        unknown = set(values) - set(fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        missing = [name for name in fields if name not in values and name not in self.DEFAULTS]
        if missing:
            raise TypeError(f"{type(self).__name__} needs {', '.join(missing)}")
        self.__dict__.update({name: values[name] if name in values else _fresh(self.DEFAULTS[name])
                              for name in fields})

    @classmethod
    def from_json(cls: type[R], data: object, where: str = "") -> R:
        """The record JSON data describes, every field present and of its type; DataMismatch otherwise."""
        if not isinstance(data, dict):
            raise DataMismatch(f"{where or cls.__name__}: a mapping expected, got {type(data).__name__}")
        fields = _fields_of(cls)
        if set(data) != set(fields):
            raise DataMismatch(f"{where or cls.__name__}: fields {sorted(data)} are not {sorted(fields)}")
        return cls(**{name: _read(kind, data[name], f"{where}.{name}" if where else name)
                      for name, kind in fields.items()})

    def model_dump(self, mode: Literal["json"] = "json") -> dict[str, Any]:
        """The JSON form (what from_json reads back): pydantic's model_dump(mode="json") of the same spec."""
        return {name: _dump(value) for name, value in self.__dict__.items()}

    def model_copy(self: R, update: Mapping[str, object] | None = None) -> R:
        """A copy with some fields replaced (not checked, as pydantic's)."""
        return type(self)(**{**self.__dict__, **(update or {})})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def _fields_of(cls: type[Record]) -> dict[str, object]:
    """The class's fields and their types: its own annotations, which this module (without `from __future__
    import annotations`) keeps as types, not text to evaluate."""
    if "_fields" not in cls.__dict__:
        cls._fields = {name: kind for name, kind in inspect.get_annotations(cls).items()
                       if name != "DEFAULTS"}  # the one class-level setting (a ClassVar)
    return cls._fields


def _fresh(default: object) -> object:
    """A default of its own for each record (a list or mapping default is copied)."""
    return type(default)(default) if isinstance(default, (list, dict)) else default


def _read(kind: object, value: object, where: str) -> object:
    """value checked against kind (str, int, bool, None, Literal, unions, list[X], dict[str, X], a Record)."""
    origin = typing.get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, Record):
        return kind.from_json(value, where)
    if kind in (str, int, bool):
        if type(value) is not kind:  # strict: True is no int, 1 no bool
            raise DataMismatch(f"{where}: {kind.__name__} expected, got {type(value).__name__}")
        return value
    if kind is type(None):
        if value is not None:
            raise DataMismatch(f"{where}: null expected, got {type(value).__name__}")
        return None
    if origin is Literal:
        if value not in typing.get_args(kind) or type(value) is not str:
            raise DataMismatch(f"{where}: one of {typing.get_args(kind)} expected")
        return value
    if origin in (types.UnionType, typing.Union):
        for option in typing.get_args(kind):
            try:
                return _read(option, value, where)
            except DataMismatch:
                continue
        raise DataMismatch(f"{where}: {kind} expected, got {type(value).__name__}")
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(kind)
        return [_read(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict and isinstance(value, dict):
        _, item = typing.get_args(kind)
        return {_read(str, k, where): _read(item, v, f"{where}.{k}") for k, v in value.items()}
    raise DataMismatch(f"{where}: {kind} expected, got {type(value).__name__}")


def _dump(value: object) -> object:
    if isinstance(value, Record):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


class SecretRef(Record):
    """Where a secret lives: an environment variable or a file. Never the value itself."""

    env: str | None
    file: str | None

    def describe(self) -> str:
        return f"environment variable {self.env}" if self.env else f"file {self.file}"


class FileRef(Record):
    """A file on the machine running opsctl (relative paths: next to the spec)."""

    file: str


class TlsFiles(Record):
    """Certificate files for one host or one node (override tls.ca / tls.cert / tls.key)."""

    DEFAULTS: ClassVar[Mapping[str, object]] = {"ca": None, "cert": None, "key": None}
    ca: FileRef | None
    cert: FileRef | None
    key: FileRef | None


class Tls(Record):
    enabled: bool
    generate: bool
    ca: FileRef | None
    cert: FileRef | None
    key: FileRef | None
    client_auth: Literal["required", "optional", "no"]
    protocols: list[TlsProtocol]
    plaintext_port: bool


class Server(Record):
    flavor: Literal["valkey", "redis"]
    version: str
    binary: str | None
    user: str | None

    @property
    def service_user(self) -> str:
        return self.user or self.flavor


class Host(Record):
    name: str
    address: str
    bind: list[str] | None
    ssh_user: str | None
    ssh_key: str | None
    ssh_port: int
    bastion: str | None
    admin_via_ssh: bool
    tls: TlsFiles | None


class NodeOverride(Record):
    port: int | None
    config: dict[str, ConfigValue]
    tls: TlsFiles | None


# The topology sections' defaults (a spec may leave its section out): pinned to the pydantic models' by a test.
class ClusterTopology(Record):
    DEFAULTS: ClassVar[Mapping[str, object]] = {
        "masters": 3, "replicas_per_master": 1, "base_port": 7101, "node_timeout_ms": 5000,
        "require_full_coverage": True, "replica_validity_factor": 10, "allow_reads_when_down": False}
    masters: int
    replicas_per_master: int
    base_port: int
    node_timeout_ms: int
    require_full_coverage: bool
    replica_validity_factor: int
    allow_reads_when_down: bool


class StandaloneTopology(Record):
    DEFAULTS: ClassVar[Mapping[str, object]] = {"host": None, "port": 7001}
    host: str | None
    port: int


class ReplicationTopology(Record):
    DEFAULTS: ClassVar[Mapping[str, object]] = {"master": None, "replicas": None, "base_port": 7201}
    master: str | None
    replicas: list[str] | None
    base_port: int


class SentinelTopology(Record):
    DEFAULTS: ClassVar[Mapping[str, object]] = {
        "hosts": None, "port": 27001, "quorum": None, "master_name": None, "down_after_ms": 5000,
        "failover_timeout_ms": 60000, "parallel_syncs": 1}
    hosts: list[str] | None
    port: int
    quorum: int | None
    master_name: str | None
    down_after_ms: int
    failover_timeout_ms: int
    parallel_syncs: int


class AclUser(Record):
    name: str
    password: SecretRef
    previous_password: SecretRef | None  # accepted too until removed: a rotation's overlap
    rules: str


class Auth(Record):
    mode: Literal["password", "acl"]
    password: SecretRef
    previous_password: SecretRef | None  # set while rotating: the password the nodes run with now
    admin_user: str
    users: list[AclUser]


class Hardening(Record):
    disabled_commands: list[str]
    renamed_commands: dict[str, str]
    rename_takeover_commands: bool
    rename_key: SecretRef | None
    allow_default_port: bool
    allow_public_bind: bool
    allow_unsafe: bool


class Persistence(Record):
    aof: Literal["always", "everysec", "no", "off"]
    rdb: list[str]


class Memory(Record):
    maxmemory: str
    policy: str


class Spec(Record):
    name: str
    topology: Topology
    server: Server
    provider: Literal["local", "ansible"]
    hosts: list[Host]
    cluster: ClusterTopology | None
    standalone: StandaloneTopology | None
    replication: ReplicationTopology | None
    sentinel: SentinelTopology | None
    auth: Auth
    hardening: Hardening
    persistence: Persistence
    memory: Memory
    lazyfree: bool
    tls: Tls
    config: dict[str, ConfigValue]
    nodes: dict[str, NodeOverride]

    def cluster_or_default(self) -> ClusterTopology:
        return self.cluster or ClusterTopology()

    def standalone_or_default(self) -> StandaloneTopology:
        return self.standalone or StandaloneTopology()

    def replication_or_default(self) -> ReplicationTopology:
        return self.replication or ReplicationTopology()

    def sentinel_or_default(self) -> SentinelTopology:
        return self.sentinel or SentinelTopology()
