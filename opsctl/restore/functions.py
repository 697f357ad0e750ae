"""A source's function libraries carried onto every target master: Redis 7 and later keep them with the data (the
RDB holds them), so a copy that moved only keys would drop them silently. Each library goes by its code
(FUNCTION LIST WITHCODE, then FUNCTION LOAD), which every server of 7 or later parses whatever wrote it. A
library a target holds already with the same code is left as it is; with other code it is refused by name, and
check_libraries says so for every source before any of them writes a key (a shard copied first is not half a copy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from opsctl.base.errors import RefusedError
from opsctl.net.rawpipe import PIPE_ERRORS, RawPipe
from opsctl.observe.replies import Reply, RespError


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
    return carry_libraries(libraries(source), source.label, targets)


def by_name(codes: Sequence[bytes]) -> dict[bytes, bytes]:
    """Library name -> code, for libraries read as code alone (an RDB file's): the name is the first line's
    `name=` argument (`#!lua name=mylib`), as FUNCTION LOAD reads it."""
    named = {}
    for code in codes:
        first = code.split(b"\n", 1)[0]
        name = next((arg[5:] for arg in first.split()[1:] if arg.startswith(b"name=")), b"")
        named[name] = code
    return named


def carry_libraries(wanted: Mapping[bytes, bytes], label: str, targets: Sequence[RawPipe]) -> int:
    """Each library (name -> code) of the source label loaded on each target that lacks it; returns how many."""
    wanted = {name: code for name, code in wanted.items() if name}
    for pipe in targets if wanted else ():
        held = libraries(pipe)
        for name, code in wanted.items():
            if name not in held:
                reply = pipe.call("FUNCTION", "LOAD", code)
                if isinstance(reply, RespError):  # another source shard's copy loaded it meanwhile
                    held = libraries(pipe)
                    if held.get(name) != code:
                        raise RefusedError(f"{pipe.label} refused the function library {_shown(name)} of "
                                           f"{label}", reply.message[:200],
                                           "a server of Redis 7 or later takes functions: fix the target, then "
                                           "re-run (it resumes)")
            elif held[name] != code:
                raise RefusedError(f"the function library {_shown(name)} differs between {label} and "
                                   f"{pipe.label}", "loading it would replace the target's code",
                                   f"make them the same (FUNCTION LOAD REPLACE on {pipe.label}, or FUNCTION "
                                   "DELETE there), then re-run: it resumes")
    return len(wanted)


def library_conflicts(sources: Mapping[str, Mapping[bytes, bytes]],
                      targets: Mapping[str, Mapping[bytes, bytes]]) -> list[str]:
    """Each library whose code differs between two sources, or between a source and a target that holds it
    already: loading it would stop the copy after other sources' keys were written. Pure."""
    problems: list[str] = []
    first_seen: dict[bytes, tuple[str, bytes]] = {}  # library -> (the first source holding it, its code there)
    for label, held in sources.items():
        for name, code in held.items():
            where, known = first_seen.setdefault(name, (label, code))
            if known != code:
                problems.append(f"the function library {_shown(name)} differs between {where} and {label}")
    for label, held in targets.items():
        problems += [f"the function library {_shown(name)} differs between {where} and {label}"
                     for name, (where, code) in first_seen.items() if name in held and held[name] != code]
    return problems


def check_libraries(sources: Mapping[str, Callable[[], RawPipe]], targets: Sequence[Callable[[], RawPipe]]) -> None:
    """Refuse, before any key is written, a copy whose function libraries conflict (library_conflicts). A node
    that cannot be read here (down, or its user lacks FUNCTION) is left to the copy's own check: this adds a
    refusal, never a new way to fail."""
    def listed(open_pipe: Callable[[], RawPipe]) -> tuple[str, dict[bytes, bytes]] | None:
        try:
            with open_pipe() as pipe:
                return pipe.label, {name: code for name, code in libraries(pipe).items() if name}
        except (RefusedError, *PIPE_ERRORS):
            return None

    source_libraries = {label: found[1] for label, open_pipe in sources.items() if (found := listed(open_pipe))}
    if not any(source_libraries.values()):
        return
    target_libraries = dict(found for open_pipe in targets if (found := listed(open_pipe)))
    problems = library_conflicts(source_libraries, target_libraries)
    if problems:
        raise RefusedError(problems[0], "\n".join(problems[1:]) or "loading it would replace the code already there",
                           "make them the same (FUNCTION LOAD REPLACE, or FUNCTION DELETE where it should not be), "
                           "then re-run; nothing was written")


def _shown(name: bytes) -> str:
    return repr(name[:60].decode("utf-8", "replace"))
