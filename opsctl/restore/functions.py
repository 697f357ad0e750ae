"""A source's function libraries carried onto every target master: Redis 7 and later keep them with the data (the
RDB holds them), so a copy that moved only keys would drop them silently. Each library goes by its code
(FUNCTION LIST WITHCODE, then FUNCTION LOAD), which every server of 7 or later parses whatever wrote it. A
library a target holds already with the same code is left as it is; with other code it is refused by name."""

from __future__ import annotations

from collections.abc import Sequence

from opsctl.base.errors import RefusedError
from opsctl.net.rawpipe import RawPipe
from opsctl.net.resp import Reply, RespError


def libraries(pipe: RawPipe) -> dict[bytes, bytes]:
    """Library name -> code on a server; empty on a server without functions (before Redis 7)."""
    reply = pipe.call("FUNCTION", "LIST", "WITHCODE")
    if isinstance(reply, RespError):
        if "unknown" in reply.message.lower():
            return {}
        raise RefusedError(f"{pipe.label} refused FUNCTION LIST", reply.message[:200],
                           "opsctl's user needs FUNCTION (+@scripting)")
    return dict(_library(entry) for entry in reply) if isinstance(reply, list) else {}


def _library(entry: Reply) -> tuple[bytes, bytes]:
    fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(entry, list) else {}
    name, code = fields.get(b"library_name"), fields.get(b"library_code")
    return (name, code) if isinstance(name, bytes) and isinstance(code, bytes) else (b"", b"")


def carry_functions(source: RawPipe, targets: Sequence[RawPipe]) -> int:
    """Every library of source loaded on each target that lacks it; returns how many the source holds."""
    wanted = {name: code for name, code in libraries(source).items() if name}
    for pipe in targets if wanted else ():
        held = libraries(pipe)
        for name, code in wanted.items():
            if name not in held:
                reply = pipe.call("FUNCTION", "LOAD", code)
                if isinstance(reply, RespError):  # another source shard's copy loaded it meanwhile
                    held = libraries(pipe)
                    if held.get(name) != code:
                        raise RefusedError(f"{pipe.label} refused the function library {_shown(name)} of "
                                           f"{source.label}", reply.message[:200],
                                           "a server of Redis 7 or later takes functions: fix the target, then "
                                           "re-run (it resumes)")
            elif held[name] != code:
                raise RefusedError(f"the function library {_shown(name)} differs between {source.label} and "
                                   f"{pipe.label}", "loading it would replace the target's code",
                                   f"make them the same (FUNCTION LOAD REPLACE on {pipe.label}, or FUNCTION "
                                   "DELETE there), then re-run: it resumes")
    return len(wanted)


def _shown(name: bytes) -> str:
    return repr(name[:60].decode("utf-8", "replace"))
