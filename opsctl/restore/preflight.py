"""What a restore refuses before it writes anything: a target without room for the data, and (fail-if-exists) a
target that already holds some of the source's keys."""

from __future__ import annotations

from collections.abc import Iterator

from opsctl.base.errors import OpsctlError, RefusedError
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import encode
from opsctl.restore.engine import TargetPipes
from opsctl.restore.route import room_problems, shown_key
from opsctl.restore.sources import Prepared, RestoreOptions
from opsctl.restore.target import Target


def _key_pages(src: RawPipe, db: int) -> Iterator[list[bytes]]:
    """Only the key names of db, a SCAN page at a time."""
    scan = src.name("SCAN")
    src.call("SELECT", db)
    cursor = b"0"
    while True:
        src.send(encode([scan, cursor, b"COUNT", 1000]))
        page = src.read(1)[0]
        if not (isinstance(page, list) and isinstance(page[0], bytes) and isinstance(page[1], list)):
            raise OpsctlError(f"unexpected SCAN reply from {src.label}", repr(page)[:200])
        yield [k for k in page[1] if isinstance(k, bytes)]
        cursor = page[0]
        if cursor == b"0":
            return


def existing_keys(prepared: Prepared, target: Target) -> tuple[int, list[str]]:
    """How many source keys the target already has, and a few of their names (EXISTS, pipelined)."""
    found, names = 0, list[str]()
    tp = TargetPipes(target.targets())
    try:
        for source in prepared.sources:
            src = source.open()
            try:
                for db in source.dbs:
                    tp.select(db)
                    for keys in _key_pages(src, db):
                        routed: list[list[bytes]] = [[] for _ in tp.pipes]
                        for key in keys:
                            routed[target.router.target(key)].append(key)
                        for pipe, part in zip(tp.pipes, routed, strict=True):
                            if not part:
                                continue
                            pipe.send(b"".join(encode([pipe.name("EXISTS"), k]) for k in part))
                            for key, reply in zip(part, pipe.read(len(part)), strict=True):
                                if reply == 1:
                                    found += 1
                                    if len(names) < 5:
                                        names.append(shown_key(key))
            finally:
                src.close()
    finally:
        tp.close()
    return found, names


def refuse_unsafe(prepared: Prepared, target: Target, options: RestoreOptions, resumed: bool) -> None:
    """Room and existing keys. A resumed run checked both before its first write, and the keys it wrote since
    count as used memory and as existing keys now: it skips them."""
    if resumed:
        return
    room = room_problems(prepared.dataset, target.room)
    if room:
        raise RefusedError("the target has no room for the data (nothing was written)", "\n".join(room),
                           "raise maxmemory (memory.maxmemory in the spec) or add masters, then restore")
    if options.mode != "fail-if-exists" or target.keys == 0:
        return
    found, names = existing_keys(prepared, target)
    if found:
        raise RefusedError(f"{found} keys of the source already exist on the target (nothing was written)",
                           "for example: " + ", ".join(repr(n) for n in names),
                           "--mode replace overwrites them, --mode skip-existing keeps the target's")
