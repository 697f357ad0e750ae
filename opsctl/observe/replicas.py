"""A master's own account of its replicas (INFO replication): a replica may report its link up before its master
counts it (Redis 7.0 and Valkey put it online at its first REPLCONF ACK), and writes under min-replicas-to-write
wait for the master's count, not the replica's. Pure."""

from __future__ import annotations

from collections.abc import Mapping


def listed_replicas(info: Mapping[str, str]) -> list[dict[str, str]]:
    """The master's slaveN entries (ip, port, state, offset, lag), in its order."""
    entries = [(int(key[5:]), value) for key, value in info.items() if key.startswith("slave") and key[5:].isdigit()]
    return [dict(p.split("=", 1) for p in value.split(",") if "=" in p) for _, value in sorted(entries)]


def master_side_problems(info: Mapping[str, str]) -> list[str]:
    """What keeps a master's replicas from counting, as the master says: a replica not online yet (wait_bgsave,
    send_bulk: its first sync is not done) and, under min-replicas-to-write, online replicas whose last ACK is older
    than min-replicas-max-lag (min_slaves_good_slaves, shown only when both are set: writes may get NOREPLICAS)."""
    if info.get("role") != "master":
        return []
    listed = listed_replicas(info)
    out = [f"lists replica {r.get('ip')}:{r.get('port')} as {r.get('state')} (its sync is not done)"
           for r in listed if r.get("state") != "online"]
    online = sum(1 for r in listed if r.get("state") == "online")
    good = info.get("min_slaves_good_slaves", "")
    if good.isdigit() and int(good) < online:
        out.append(f"counts {good} of {online} online replica(s) as acking within min-replicas-max-lag")
    return out
