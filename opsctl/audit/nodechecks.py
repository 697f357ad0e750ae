"""Checks of one running node from what it answered: config drift, probes of dangerous commands, auth,
slowlog, memory and clients. Pure: replies in, findings and table rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.observe.findings import Finding, finding
from opsctl.observe.replies import as_text
from opsctl.render.directives import Directive

# Directives not compared: secrets, provider paths, names that differ in form between file and CONFIG GET.
SKIPPED = {"requirepass", "masterauth", "aclfile", "masteruser", "rename-command", "appendfilename", "dbfilename",
           "cluster-config-file", "daemonize", "pidfile", "logfile", "dir", "include",
           "tls-cert-file", "tls-key-file", "tls-ca-cert-file"}  # paths on the host: `audit tls` checks the certs
SIZES = {"maxmemory", "repl-backlog-size", "client-query-buffer-limit", "proto-max-bulk-len"}
RULE_OF = {"protected-mode": ("protected-mode", "critical"), "bind": ("bind", "high"),
           "appendonly": ("persistence", "medium"), "appendfsync": ("persistence", "medium"),
           "save": ("persistence", "medium"), "aof-use-rdb-preamble": ("persistence", "low"),
           "maxmemory": ("maxmemory", "high"), "maxmemory-policy": ("maxmemory", "medium"),
           "enable-protected-configs": ("protected-configs", "high"),
           "enable-debug-command": ("protected-configs", "high"),
           "enable-module-command": ("protected-configs", "high")}
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000**2, "mb": 1024**2, "g": 1000**3, "gb": 1024**3}


def size_bytes(text: str) -> int | None:
    """A Redis memory size ("64mb", "1g", "1024") in bytes, with Redis's units (m = 10^6, mb = 2^20)."""
    text = text.strip().lower()
    digits = text.rstrip("bkmg")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in _UNITS:
        return None
    return int(digits) * _UNITS[unit]


def normalized(name: str, value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if name in SIZES:
        return str(size_bytes(value))
    if name == "bind":
        return " ".join(sorted(value.split()))
    return " ".join(value.lower().split())


def config_drift(node: str, expected: Iterable[Directive], live: Mapping[str, str]) -> list[Finding]:
    """One finding per directive whose running value differs from the rendered one."""
    out = []
    for name, value in expected:
        if name in SKIPPED or name not in live:
            continue
        want, have = normalized(name, value), normalized(name, live[name])
        if want == have:
            continue
        rule, severity = RULE_OF.get(name, ("lazyfree", "high") if "lazy" in name else ("config-drift", "medium"))
        out.append(finding(rule, severity, node, f"{name} is {live[name]!r}, the spec says {value!r}",
                           f"run `opsctl apply -f SPEC` (CONFIG SET {name} and rewrite), or change the spec",
                           directive=name, expected=value, actual=live[name]))
    return out


def command_available(error: str | None) -> bool:
    """Did a probe reach the command? Argument errors mean yes; unknown command / NOPERM / not allowed mean no."""
    if error is None:
        return True
    text = error.lower()
    return not any(s in text for s in ("unknown command", "noperm", "not allowed", "no permissions"))


@dataclass(frozen=True)
class Probe:
    """A harmless call of a command that must be unavailable: argument errors prove it exists."""

    command: str
    args: tuple[str, ...]
    renamed_to: str | None = None


def probes(disabled: Sequence[str], renamed: Mapping[str, str]) -> list[Probe]:
    harmless = {"KEYS": (), "FLUSHALL": ("opsctl-probe", "x", "y"), "FLUSHDB": ("opsctl-probe", "x", "y"),
                "CONFIG": ("HELP",), "DEBUG": ("HELP",), "ACL": ("HELP",),
                # too few arguments or an unknown option: refused before the command does anything
                "MIGRATE": (), "REPLICAOF": (), "SLAVEOF": (), "SHUTDOWN": ("opsctl-probe",),
                "FAILOVER": ("opsctl-probe",)}
    out = [Probe(c.upper(), harmless[c.upper()]) for c in disabled if c.upper() in harmless]
    out += [Probe(c.upper(), harmless.get(c.upper(), ("HELP",)), new) for c, new in sorted(renamed.items())]
    return out


def probe_findings(node: str, results: Mapping[str, str | None], checked: Sequence[Probe]) -> list[Finding]:
    out = []
    for probe in checked:
        if probe.command in results and command_available(results[probe.command]):
            how = "renamed to a secret name" if probe.renamed_to else "disabled"
            out.append(finding("dangerous-command", "critical", node, f"{probe.command} is callable under its own "
                               f"name; the spec says {how}", "run `opsctl apply -f SPEC` to restart the node with "
                               "the rendered rename-command lines / ACL rules", command=probe.command))
    return out


def auth_findings(node: str, anonymous_error: str | None, default_flags: Sequence[str] | None,
                  acl_mode: bool) -> list[Finding]:
    out = []
    if anonymous_error is None:
        out.append(finding("auth", "critical", node, "a client without a password can run commands",
                           "set requirepass (auth.mode: password) or an ACL file with `user default off`"))
    if default_flags is not None:
        flags = {f.lower() for f in default_flags}
        if acl_mode and "off" not in flags:
            out.append(finding("default-user", "critical", node, "the ACL default user is on",
                               "ACL SETUSER default off, then ACL SAVE (opsctl apply renders it)"))
        if "nopass" in flags:
            out.append(finding("auth", "critical", node, "the default user has nopass",
                               "give the default user a password or turn it off"))
    return out


def _num(info: Mapping[str, str], name: str) -> float:
    try:
        return float(info.get(name, "0"))
    except ValueError:
        return 0.0


def memory_row(node: str, info: Mapping[str, str], maxclients: int) -> dict[str, Any]:
    used, limit = int(_num(info, "used_memory")), int(_num(info, "maxmemory"))
    return {"node": node, "used_memory": used, "maxmemory": limit,
            "used_share": round(used / limit, 3) if limit else None,
            "fragmentation": _num(info, "mem_fragmentation_ratio"),
            "clients": int(_num(info, "connected_clients")), "maxclients": maxclients}


def memory_findings(row: Mapping[str, Any], big_memory: int = 100 * 1024 * 1024) -> list[Finding]:
    node, out = str(row["node"]), []
    share, frag, used = row["used_share"], float(row["fragmentation"]), int(row["used_memory"])
    if share is not None and share > 0.8:
        out.append(finding("memory-headroom", "high" if share > 0.9 else "medium", node,
                           f"{used} of {row['maxmemory']} bytes used ({share:.0%})",
                           "raise memory.maxmemory, add shards, or delete/expire keys", share=share))
    if used >= big_memory and frag > 1.5:
        out.append(finding("fragmentation", "medium", node, f"fragmentation ratio {frag:.2f}",
                           "CONFIG SET activedefrag yes (jemalloc), or restart the replica then fail over"))
    if row["maxclients"] and row["clients"] > 0.8 * row["maxclients"]:
        out.append(finding("clients", "medium", node, f"{row['clients']} clients of maxclients {row['maxclients']}",
                           "use connection pools with a bounded size; raise maxclients only with ulimit -n"))
    return out


def slowlog_rows(node: str, entries: Sequence[Sequence[Any]], top: int = 10) -> list[dict[str, Any]]:
    """SLOWLOG GET entries grouped by command: count, worst and total µs. Arguments are never shown."""
    by: dict[str, dict[str, Any]] = {}
    for entry in entries:
        args = entry[3] if len(entry) > 3 else []
        name = as_text(args[0]).upper() if args else "?"
        row = by.setdefault(name, {"node": node, "command": name, "count": 0, "max_us": 0, "total_us": 0})
        row["count"] += 1
        row["max_us"] = max(row["max_us"], int(entry[2]))
        row["total_us"] += int(entry[2])
    return sorted(by.values(), key=lambda r: -r["max_us"])[:top]


def slowlog_findings(node: str, rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    if not rows:
        return []
    worst = rows[0]
    total = sum(int(r["count"]) for r in rows)
    return [finding("slowlog", "high" if worst["max_us"] >= 100_000 else "medium", node,
                    f"{total} slow commands logged, worst {worst['command']} at {worst['max_us']} µs",
                    "find the callers of these commands; replace O(N) calls (HGETALL, SMEMBERS, ...) with SCAN "
                    "variants or bounded ranges", commands=[r["command"] for r in rows])]


def hotkey_setup_finding(node: str, policy: str) -> Finding:
    return finding("hotkey", "info", node, f"hot keys not measured: maxmemory-policy is {policy}, OBJECT FREQ needs "
                   "an LFU policy", "set memory.policy: allkeys-lfu (or volatile-lfu) in the spec and apply; or "
                   "sample briefly with `redis-cli --hotkeys` on a node with an LFU policy", policy=policy)
