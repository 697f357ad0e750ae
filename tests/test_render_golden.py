"""Golden files: every rendered file of every node, per topology, auth mode and flavor.

tests/golden/<case>/spec.yaml is the input; tests/golden/<case>/<node>/<file> the expected output. Cases whose
name ends in -revealed render real secrets (a password full of quoting hazards); the others are masked.
UPDATE_GOLDEN=1 rewrites the expected files: read the diff as an operator would before committing it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from opsctl.base.secrets import MASK
from opsctl.render import default_paths, render_node
from opsctl.spec.load import TAKEOVER_COMMANDS, LoadedSpec, load_spec, make_resolver
from opsctl.spec.text import split_args
from tests.support import PASSWORD, PASSWORD_ENV

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "spec.yaml").is_file())
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
APP_PASSWORD = "app-pw-3e9a41c07b5d"
TRICKY = "Qu\"ote\\back$lash#x'y!{}"  # no spaces: the weak-secret check refuses them
SECRETS = {PASSWORD_ENV: PASSWORD, "OPSCTL_GOLDEN_APP_PASSWORD": APP_PASSWORD,
           "OPSCTL_GOLDEN_TRICKY_PASSWORD": TRICKY}


def load_case(case: str) -> LoadedSpec:
    text = (GOLDEN / case / "spec.yaml").read_text()
    return load_spec(text, "spec.yaml", make_resolver(SECRETS, lambda _name: None))


def render_case(case: str) -> dict[str, str]:
    """relative path -> text for every file of every node, rendered under /var/lib/opsctl/<spec name>."""
    loaded = load_case(case)
    reveal = case.endswith("-revealed")
    files: dict[str, str] = {}
    for node in loaded.layout.nodes:
        paths = default_paths(f"/var/lib/opsctl/{loaded.spec.name}", node)
        for name, text in render_node(loaded, node, paths, reveal=reveal).files.items():
            files[f"{node.name}/{name}"] = text
    return files


def stored(case: str) -> dict[str, str]:
    root = GOLDEN / case
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.glob("*/*")) if p.is_file()}


def write_case(case: str, files: dict[str, str]) -> None:
    root = GOLDEN / case
    for old in root.iterdir():
        if old.is_dir():
            shutil.rmtree(old)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def directives(text: str) -> list[tuple[str, str]]:
    """(name, rest) per non-comment line; 'sentinel x' counts as one name."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        words = line.split(" ", 2) if line.startswith("sentinel ") else line.split(" ", 1)
        if line.startswith("sentinel "):
            out.append((f"{words[0]} {words[1]}", words[2] if len(words) > 2 else ""))
        else:
            out.append((words[0], words[1] if len(words) > 1 else ""))
    return out


def test_every_kind_has_a_case() -> None:
    for topology in ("standalone", "replication", "sentinel", "cluster"):
        for flavor in ("valkey", "redis"):
            for mode in ("password", "acl"):
                assert f"{topology}-{flavor}-{mode}" in CASES
    assert any(c.endswith("-revealed") for c in CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    files = render_case(case)
    if UPDATE:
        write_case(case, files)
    assert sorted(files) == sorted(stored(case)), "the set of rendered files changed"
    for rel, text in files.items():
        assert text == stored(case)[rel], f"{case}/{rel} differs from the golden file"


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("-revealed")])
def test_masked_output_holds_no_secret(case: str) -> None:
    for rel, text in render_case(case).items():
        for secret in (PASSWORD, APP_PASSWORD):
            assert secret not in text, rel
            assert hashlib.sha256(secret.encode()).hexdigest() not in text, rel
        assert MASK in text, rel


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("-revealed")])
def test_revealed_secrets_parse_back_exactly(case: str) -> None:
    """What the server reads from requirepass/masterauth/auth-pass is the password itself, quotes and all."""
    files = render_case(case)
    secret_lines = 0
    for rel, text in files.items():
        for line in text.splitlines():
            args = split_args(line) if not line.startswith("#") else []
            if args[:1] in (["requirepass"], ["masterauth"]) or args[:2] == ["sentinel", "sentinel-pass"]:
                assert args[-1] == TRICKY, f"{rel}: {line}"
                secret_lines += 1
            if args[:2] == ["sentinel", "auth-pass"]:
                assert args[3] == TRICKY and len(args) == 4, f"{rel}: {line}"
                secret_lines += 1
            if args[:1] == ["user"] and args[1] != "default":
                wanted = TRICKY if args[1] == "opsctl" else APP_PASSWORD
                assert f"#{hashlib.sha256(wanted.encode()).hexdigest()}" in args, f"{rel}: {line}"
                secret_lines += 1
        assert TRICKY not in text or rel.endswith(".conf"), "users.acl holds hashes only"
    assert secret_lines >= 2


HARDENED = {
    "protected-mode": "yes", "enable-protected-configs": "no", "enable-debug-command": "no",
    "enable-module-command": "no", "appendonly": "yes", "appendfsync": "everysec", "aof-use-rdb-preamble": "yes",
    "save": "900 1 300 10 60 10000", "maxmemory": "512mb", "maxmemory-policy": "allkeys-lru",
    "lazyfree-lazy-eviction": "yes", "lazyfree-lazy-expire": "yes", "lazyfree-lazy-server-del": "yes",
    "lazyfree-lazy-user-del": "yes", "replica-lazy-flush": "yes", "maxclients": "10000", "timeout": "0",
    "tcp-keepalive": "300", "slowlog-log-slower-than": "10000", "slowlog-max-len": "1024",
    "latency-monitor-threshold": "100", "repl-backlog-size": "64mb", "repl-diskless-sync": "yes",
    "repl-diskless-load": "disabled",
}
CLUSTER = {"cluster-enabled": "yes", "cluster-require-full-coverage": "yes", "cluster-allow-replica-migration": "no",
           "cluster-replica-validity-factor": "10", "cluster-allow-reads-when-down": "no",
           "cluster-node-timeout": "5000"}


def server_configs(case: str) -> list[tuple[str, dict[str, list[str]]]]:
    out = []
    for rel, text in render_case(case).items():
        if rel.endswith("/redis.conf"):
            table: dict[str, list[str]] = {}
            for name, value in directives(text):
                table.setdefault(name, []).append(value)
            out.append((rel, table))
    return out


@pytest.mark.parametrize("case", CASES)
def test_hardened_table_is_rendered(case: str) -> None:
    """The hardened table of redis-practices.md, directive by directive, on every server node."""
    loaded = load_case(case)
    acl = loaded.spec.auth.mode == "acl"
    for rel, conf in server_configs(case):
        single = {k: v[0] for k, v in conf.items() if len(v) == 1}
        for name, value in {**HARDENED, **(CLUSTER if loaded.spec.topology == "cluster" else {})}.items():
            assert single.get(name) == value, f"{rel}: {name}"
        node = loaded.layout.node(rel.split("/")[0])
        assert single["bind"] == node.address and single["port"] == str(node.port)
        assert node.port not in (6379, 26379)
        renames = conf["rename-command"]
        assert "CONFIG OPS_CONFIG_G0LD" in renames and "REPLICAOF OPS_REPLICAOF_G0LD" in renames
        assert {f'{c} ""' for c in ("FLUSHALL", "FLUSHDB", "KEYS")} <= set(renames), "removed in both auth modes"
        if acl:
            assert "requirepass" not in conf and single["masteruser"] == "opsctl"
            assert single["aclfile"].endswith("/users.acl") and "masterauth" in single
        else:
            assert "requirepass" in single and "masterauth" in single and "aclfile" not in conf
        assert ("hide-user-data-from-log" in single) == (loaded.spec.server.flavor == "valkey"), \
            "hide-user-data-from-log: Valkey >= 8.0 and Redis >= 7.4 only; Redis 7.0 refuses to start with it"
        assert not any(len(v) > 1 for k, v in conf.items() if k != "rename-command"), "a directive twice"


@pytest.mark.parametrize("case", [c for c in CASES if "-acl" in c])
def test_acl_file_denies_disabled_commands(case: str) -> None:
    for rel, text in render_case(case).items():
        if rel.endswith("users.acl"):
            lines = text.splitlines()
            assert lines[0] == "user default off"
            users = [line for line in lines if line.startswith("user ") and line != "user default off"]
            assert [u.split()[1] for u in users] == ["opsctl", "app"]
            for user in users:
                assert user.split()[2] == "on" and user.split()[3].startswith("#")
                assert user.endswith(" -flushall -flushdb -keys"), user


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("sentinel-")])
def test_sentinel_knows_renamed_commands_and_auth(case: str) -> None:
    loaded = load_case(case)
    name = loaded.spec.name
    for rel, text in render_case(case).items():
        if not rel.endswith("sentinel.conf"):
            continue
        table = directives(text)
        values = {k: v for k, v in table}
        assert values["sentinel monitor"].startswith(f"{name} 127.0.0.2 7201 2")
        renamed = [v for k, v in table if k == "sentinel rename-command"]
        assert [f"{name} CONFIG OPS_CONFIG_G0LD", f"{name} REPLICAOF OPS_REPLICAOF_G0LD"] == \
            [r for r in renamed if r.split()[1] in ("CONFIG", "REPLICAOF")]
        assert renamed == [f"{name} {c} {new}" for c, new in sorted(loaded.renames.items())], \
            "sentinel knows every name the nodes run a command under"
        if loaded.spec.auth.mode == "password":
            assert {r.split()[1] for r in renamed} == {*TAKEOVER_COMMANDS}
        assert values["protected-mode"] == "yes" and "requirepass" in values and "sentinel auth-pass" in values
        assert ("sentinel auth-user" in values) == (loaded.spec.auth.mode == "acl")
        monitor_at = [k for k, _ in table].index("sentinel monitor")
        per_master = [i for i, (k, v) in enumerate(table) if v.startswith(f"{name} ") and k != "sentinel monitor"]
        assert all(i > monitor_at for i in per_master), "sentinel refuses per-master lines before the monitor"


def test_redis_62_gets_one_save_line_per_rule() -> None:
    """Redis < 7.0 ignores `save 900 1 300 10` (only `save <seconds> <changes>` lines count)."""
    text = (GOLDEN / "standalone-redis-password" / "spec.yaml").read_text().replace('"7.0"', '"6.2"')
    loaded = load_spec(text, "spec.yaml", make_resolver(SECRETS, lambda _name: None))
    node = loaded.layout.nodes[0]
    conf = render_node(loaded, node, default_paths("/var/lib/opsctl/x", node)).files["redis.conf"]
    assert [v for k, v in directives(conf) if k == "save"] == ["900 1", "300 10", "60 10000"]
    assert "enable-protected-configs" not in conf and "hide-user-data-from-log" not in conf


def test_redis_74_hides_user_data_from_log() -> None:
    text = (GOLDEN / "standalone-redis-password" / "spec.yaml").read_text().replace('"7.0"', '"7.4"')
    loaded = load_spec(text, "spec.yaml", make_resolver(SECRETS, lambda _name: None))
    node = loaded.layout.nodes[0]
    conf = render_node(loaded, node, default_paths("/var/lib/opsctl/x", node)).files["redis.conf"]
    assert ("hide-user-data-from-log", "yes") in directives(conf)
