"""Turn spec text into a validated Spec, or one SpecError listing every problem with file:line."""

from __future__ import annotations

import copy
import difflib
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from opsctl.base.errors import SpecError, SpecProblem, echo
from opsctl.spec import pydantic_model
from opsctl.spec.crosschecks import Refusal, check_spec, suggest
from opsctl.spec.extends import Reader, merged_document, read_base
from opsctl.spec.model import Spec
from opsctl.spec.secretrefs import HIDDEN, SecretResolver, public_path, secret_hint, shown, unquoted
from opsctl.spec.yamlpos import Path_, PositionedDocument, field_path

FIELD_HINTS: dict[str, str] = {
    "name": "lowercase letters, digits and '-', 1 to 40 characters, e.g. orders",
    "version": "major.minor in quotes, e.g. version: \"9.1\"",
    "maxmemory": "a size such as 256mb, 2gb or 1048576",
    "auth:missing": "add auth: {password: {env: REDIS_PASSWORD}}; the secret itself stays out of the spec",
    "hosts": "list the machines, e.g. - {name: h1, address: 127.0.0.2}",
    "aof": "everysec (fsync once a second) is the usual choice; off turns the AOF off",
    "ssh_user": "a login name: letters, digits, '_', '.' and '-', at most 32 characters, e.g. ops",
    "bastion": "[user@]address[:port], e.g. ops@jump.example.com:2222, or the name of a host of the spec",
    "follows": "follows: {spec: PRIMARY_SPEC} or {endpoints: [HOST:PORT], password: {env: VAR}} (docs/standby.md)",
    "env": "the name of an environment variable (letters, digits and _), e.g. REDIS_PASSWORD; the secret goes in it",
}

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails


def validated_spec(text: str, file: str, resolve: SecretResolver | None, read: Reader = read_base) -> Spec:
    """resolve None: secrets are not checked (validate --no-secrets). read: how the bases `extends:` names are read
    (opsctl.spec.extends); every problem names the file (the spec or a base) and line its value came from."""
    doc, problems = merged_document(text, file, read)
    if doc is None:
        raise SpecError(problems, file)
    return validated_document(doc, problems, resolve)


def validated_document(doc: PositionedDocument, problems: list[SpecProblem], resolve: SecretResolver | None) -> Spec:
    """A merged document (opsctl.spec.extends) validated; problems: those found already (reading it)."""
    file = doc.file
    if not isinstance(doc.data, dict):
        raise SpecError([*problems, _not_a_mapping(file, doc.data)], file)
    spec, errors = _validate(doc.data)
    errors = _without_typo_echoes(errors)
    problems += [_problem(doc, err) for err in errors]
    if spec is not None:
        broken = [_clean_loc(err["loc"]) for err in errors]
        problems += [SpecProblem(*doc.origin_of(path), field_path(path), msg, hint, isinstance(f, Refusal))
                     for f in check_spec(spec, resolve) for path, msg, hint in (f,)
                     if not any(path[: len(b)] == b for b in broken)]
    if problems or spec is None or errors:
        # the spec's own problems first, then each base's; by line within a file
        raise SpecError(sorted(_dedupe(problems), key=lambda p: (p.file != file, p.file, p.line or 0)), file)
    return spec


def _not_a_mapping(file: str, data: object) -> SpecProblem:
    hint = "a spec is a mapping of fields (name, topology, hosts, auth, ...): see examples/ or `opsctl schema`"
    if data is None:
        return SpecProblem(file, 1, "", "the spec is empty", hint)
    kind = "a list" if isinstance(data, list) else f"a single value ({echo(data)})"
    return SpecProblem(file, 1, "", f"the spec must be a mapping of fields, not {kind}", hint)


def _without_typo_echoes(errors: list[Any]) -> list[Any]:
    """Drop 'field is required' when an unknown sibling field is its likely misspelling (one problem, not two)."""
    typos: set[Path_] = set()
    for err in errors:
        path = _clean_loc(err["loc"])
        if err["type"] == "extra_forbidden" and path:
            for close in difflib.get_close_matches(str(path[-1]), _allowed_fields(path[:-1]), n=1):
                typos.add((*path[:-1], close))
    return [e for e in errors if not (e["type"] == "missing" and _clean_loc(e["loc"]) in typos)]


def _validate(data: dict[str, Any]) -> tuple[Spec | None, list[Any]]:
    """Validate; on errors also try once more without the broken fields, so cross-field checks still run. The
    spec comes back as plain values (opsctl.spec.model), made from the validated model's JSON form."""
    try:
        return _plain(pydantic_model.Spec.model_validate(data)), []
    except ValidationError as exc:
        errors = exc.errors()
    pruned = copy.deepcopy(data)
    for err in errors:
        _prune(pruned, _clean_loc(err["loc"]))
    try:
        return _plain(pydantic_model.Spec.model_validate(pruned)), errors
    except ValidationError:
        return None, errors


def _plain(validated: pydantic_model.Strict) -> Spec:
    return Spec.from_json(validated.model_dump(mode="json"))


def _prune(data: object, path: Path_) -> None:
    for part in path[:-1]:
        if isinstance(data, dict) and part in data:
            data = data[part]
            continue
        if not (isinstance(data, list) and isinstance(part, int) and part < len(data)):
            return
        data = data[part]
    if path and isinstance(data, dict):
        data.pop(path[-1], None)


def _clean_loc(loc: tuple[Any, ...]) -> Path_:
    return tuple(p for p in loc if not _is_internal(p))


def _dedupe(problems: list[SpecProblem]) -> list[SpecProblem]:
    seen: set[SpecProblem] = set()
    return [p for p in problems if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _problem(doc: PositionedDocument, err: ErrorDetails) -> SpecProblem:
    path = _clean_loc(err["loc"])
    message, hint = _message(err, path)
    return SpecProblem(*doc.origin_of(path), field_path(path), message, hint)


def _is_internal(part: object) -> bool:
    """pydantic adds validator names such as 'function-after[...]' to locations."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "bool"))


def _message(err: ErrorDetails, path: Path_) -> tuple[str, str]:
    """The problem's message and hint; at a secret place (opsctl.spec.secretrefs) neither quotes what was written
    there, and the hint says how the secret is given instead."""
    message, hint = _words(err, path, shown(err.get("input"), path))
    message = unquoted(message, err.get("input"), path)
    withheld = HIDDEN in message or public_path(path) != path
    return message, (secret_hint(public_path(path)) or hint) if withheld else hint


def _words(err: ErrorDetails, path: Path_, value: str) -> tuple[str, str]:
    """The problem's message and hint, quoting the value written as value says."""
    kind, ctx = err["type"], err.get("ctx", {})
    leaf = str(path[-1]) if path else ""
    if kind == "extra_forbidden":
        allowed = _allowed_fields(path[:-1])
        what = "unknown field" if public_path(path) == path else "unknown field (its name is not shown: a secret)"
        return what, f"{suggest(leaf, allowed)}allowed here: {', '.join(allowed)}"
    if kind == "missing":
        return "is required", FIELD_HINTS.get(f"{leaf}:missing", f"add '{leaf}:'")
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {value}", FIELD_HINTS.get(leaf, "")
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be a whole number, got {value}", "write the number without quotes"
    if kind == "string_type":
        return f"must be a string, got {value}", FIELD_HINTS.get(leaf, "quote the value")
    if kind == "bool_type":
        return f"must be true or false, got {value}", "write true or false without quotes"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {value}", "write it as [a, b] or as '- a' lines"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"must be a mapping of fields, got {value}", "write it as 'field: value' lines"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}, got {value}", ""
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}, got {value}", ""
    if kind == "too_short":
        return (f"needs at least {ctx.get('min_length')} entr{'y' if ctx.get('min_length') == 1 else 'ies'}",
                FIELD_HINTS.get(leaf, ""))
    if kind == "string_pattern_mismatch":
        return f"{value} is not valid", FIELD_HINTS.get(leaf, "")
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, "), FIELD_HINTS.get(leaf, "") if leaf == "follows" else ""
    return str(err["msg"]), ""


def _allowed_fields(path: Path_) -> list[str]:
    """The field names of the model at path (walks Spec's annotations; list indexes and mapping keys skipped)."""
    model: type[BaseModel] = pydantic_model.Spec
    keyed = False
    for part in path:
        if isinstance(part, int) or keyed:
            keyed = False
            continue
        info = model.model_fields.get(str(part))
        inner = _model_in(info.annotation) if info else None
        if info is None or inner is None:
            return []
        keyed = _is_mapping(info.annotation)
        model = inner
    return list(model.model_fields)


def _is_mapping(annotation: object) -> bool:
    return typing.get_origin(annotation) is dict or any(_is_mapping(a) for a in typing.get_args(annotation))


def _model_in(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
