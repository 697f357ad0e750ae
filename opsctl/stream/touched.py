"""Which keys a replicated command touches, and what a replay may not carry (docs/migrate.md, "The edges").

A master's stream holds the effects of writes: a command unknown here is refused, never guessed at, since a wrong
guess routes a write to a shard that does not own its key. Expiries are moved between clocks: Redis 7 and Valkey
propagate absolute forms (PXAT, PEXPIREAT, ABSTTL), older servers relative ones, which become absolute from the
time the command arrived.
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> (first key, last key (-1: the last argument), step); a key spec as COMMAND INFO's legacy triple
_ONE = (1, 1, 1)
KEYS: dict[bytes, tuple[int, int, int]] = {
    **{name: _ONE for name in (
        b"SET", b"SETNX", b"SETEX", b"PSETEX", b"APPEND", b"INCR", b"DECR", b"INCRBY", b"DECRBY", b"INCRBYFLOAT",
        b"GETSET", b"GETDEL", b"GETEX", b"SETRANGE", b"SETBIT", b"BITFIELD", b"EXPIRE", b"PEXPIRE", b"EXPIREAT",
        b"PEXPIREAT", b"PERSIST", b"HSET", b"HSETNX", b"HMSET", b"HDEL", b"HINCRBY", b"HINCRBYFLOAT", b"HEXPIRE",
        b"HPEXPIRE", b"HEXPIREAT", b"HPEXPIREAT", b"HPERSIST", b"HSETEX", b"HGETEX", b"HGETDEL", b"LPUSH", b"RPUSH",
        b"LPUSHX", b"RPUSHX", b"LPOP", b"RPOP", b"LSET", b"LINSERT", b"LREM", b"LTRIM", b"SADD", b"SREM", b"SPOP",
        b"ZADD", b"ZINCRBY", b"ZREM", b"ZREMRANGEBYSCORE", b"ZREMRANGEBYRANK", b"ZREMRANGEBYLEX", b"ZPOPMIN",
        b"ZPOPMAX", b"XADD", b"XDEL", b"XTRIM", b"XACK", b"XCLAIM", b"XAUTOCLAIM", b"XSETID", b"PFADD", b"RESTORE",
        b"GEOADD", b"DELIFEQ", b"SETIFEQ")},
    **{name: (1, -1, 1) for name in (b"DEL", b"UNLINK", b"TOUCH", b"PFMERGE", b"SINTERSTORE", b"SUNIONSTORE",
                                     b"SDIFFSTORE")},
    **{name: (1, -1, 2) for name in (b"MSET", b"MSETNX")},
    **{name: (1, 2, 1) for name in (b"RENAME", b"RENAMENX", b"SMOVE", b"LMOVE", b"RPOPLPUSH", b"COPY",
                                    b"ZRANGESTORE", b"GEOSEARCHSTORE")},
    b"BITOP": (2, -1, 1),
    b"XGROUP": (2, 2, 1),
}
NUMKEYS = (b"ZUNIONSTORE", b"ZINTERSTORE", b"ZDIFFSTORE")  # dest numkeys key...
SPLITTABLE = frozenset({b"DEL", b"UNLINK", b"TOUCH", b"MSET"})  # per-key effects: may go to several shards
SKIPPED = frozenset({b"PING", b"REPLCONF", b"PUBLISH", b"SPUBLISH"})  # the link's traffic; messages are not data
REFUSED = {
    b"FLUSHALL": "FLUSHALL empties the source: replaying it would empty every target shard",
    b"FLUSHDB": "FLUSHDB empties a database of the source: replaying it would empty every target shard",
    b"SWAPDB": "SWAPDB swaps whole databases, which the target cannot do key by key",
    b"MOVE": "MOVE moves a key to another database",
    b"FUNCTION": "functions are not carried (load them on the target yourself)",
    b"SCRIPT": "scripts are not carried (a Redis 7 / Valkey master replicates their effects, not the script)",
    b"EVAL": "a script replicated verbatim (an old server): its keys cannot be routed",
    b"EVALSHA": "a script replicated verbatim (an old server): its keys cannot be routed",
}


@dataclass(frozen=True)
class Kind:
    """What to do with one command: apply (keys), skip (the link's traffic), select (db), begin/end a
    transaction, or refuse (why)."""

    action: str  # apply | skip | select | multi | exec | refuse
    keys: tuple[bytes, ...] = ()
    db: int = 0
    why: str = ""


def classify(args: tuple[bytes, ...]) -> Kind:
    name = args[0].upper()
    if name in SKIPPED:
        return Kind("skip")
    if name == b"SELECT":
        return Kind("select", db=int(args[1]))
    if name in (b"MULTI", b"EXEC"):
        return Kind(name.decode().lower())
    if name in REFUSED:
        return Kind("refuse", why=REFUSED[name])
    keys = command_keys(name, args)
    if keys is None:
        return Kind("refuse", why=f"opsctl does not know which keys {name.decode('utf-8', 'replace')[:40]} touches "
                    "(a module's command, or one newer than opsctl)")
    return Kind("apply", keys)


def command_keys(name: bytes, args: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """The keys of a write command, None when unknown."""
    if name in NUMKEYS and len(args) > 2:
        return (args[1], *args[3:3 + int(args[2])])
    spec = KEYS.get(name)
    if spec is None:
        return None
    first, last, step = spec
    end = len(args) + last if last < 0 else last
    return tuple(args[first:end + 1:step])


def split(args: tuple[bytes, ...], owner: list[int]) -> dict[int, tuple[bytes, ...]]:
    """A SPLITTABLE command's parts per target index, owner[i] being the target of its i-th key."""
    name = args[0]
    width = 2 if name.upper() == b"MSET" else 1
    parts: dict[int, list[bytes]] = {}
    for i, target in enumerate(owner):
        parts.setdefault(target, [name]).extend(args[1 + i * width:1 + (i + 1) * width])
    return {t: tuple(p) for t, p in parts.items()}


# -- expiries -----------------------------------------------------------------------------------------------------

_RELATIVE = {b"EXPIRE": 1000, b"PEXPIRE": 1, b"SETEX": 1000, b"PSETEX": 1}


def absolute_expiry(args: tuple[bytes, ...], shift_ms: int, arrived_ms: int) -> tuple[bytes, ...]:
    """args with every expiry absolute and moved by shift_ms (the target's clock minus the source's): relative ones
    count from arrived_ms (the source's clock, when the command arrived)."""
    name = args[0].upper()
    out = list(args)
    if name in (b"EXPIRE", b"PEXPIRE"):
        out[0:3] = [b"PEXPIREAT", args[1], _ms(arrived_ms + int(args[2]) * _RELATIVE[name] + shift_ms)]
    elif name in (b"SETEX", b"PSETEX"):
        return (b"SET", args[1], args[3], b"PXAT", _ms(arrived_ms + int(args[2]) * _RELATIVE[name] + shift_ms))
    elif name in (b"PEXPIREAT", b"HPEXPIREAT"):
        out[2] = _ms(int(args[2]) + shift_ms)
    elif name in (b"EXPIREAT", b"HEXPIREAT"):
        out[0] = b"P" + name
        out[2] = _ms(int(args[2]) * 1000 + shift_ms)
    elif name == b"RESTORE":
        return _restore(args, shift_ms, arrived_ms)
    elif name in (b"SET", b"GETEX", b"HSETEX", b"HGETEX"):
        _options(out, 3 if name == b"SET" else 2, shift_ms, arrived_ms)
    return tuple(out)


def _restore(args: tuple[bytes, ...], shift_ms: int, arrived_ms: int) -> tuple[bytes, ...]:
    ttl = int(args[2])
    if ttl == 0:
        return args
    absolute = any(a.upper() == b"ABSTTL" for a in args[4:])
    at = ttl + shift_ms if absolute else arrived_ms + ttl + shift_ms
    rest = [a for a in args[4:] if a.upper() != b"ABSTTL"]
    return (args[0], args[1], _ms(at), args[3], *rest, b"ABSTTL")


def _options(out: list[bytes], start: int, shift_ms: int, arrived_ms: int) -> None:
    """SET/GETEX/HSETEX/HGETEX's EX/PX/EXAT/PXAT option (before FIELDS), made PXAT in the target's clock."""
    for i, word in enumerate(out[start:-1], start=start):
        upper = word.upper()
        if upper == b"FIELDS":
            return
        if upper in (b"EX", b"PX", b"EXAT", b"PXAT"):
            value = int(out[i + 1])
            at = {b"EX": arrived_ms + value * 1000, b"PX": arrived_ms + value, b"EXAT": value * 1000,
                  b"PXAT": value}[upper]
            out[i:i + 2] = [b"PXAT", _ms(at + shift_ms)]
            return


def _ms(value: int) -> bytes:
    return str(value).encode()
