"""One pydantic model per record of opsctl.spec.model, derived from its declaration (fields, types, markers,
defaults, descriptions, check()) when this module is imported, that is when a spec is validated or its JSON Schema
is asked for. Derived, so the schema is declared once, in opsctl.spec.model.

JSON Schema of the spec, for editors (yaml-language-server) and CI."""

from __future__ import annotations

import typing
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StringConstraints,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from opsctl.base.errors import echo
from opsctl.base.record import Check, Hidden, Length, Pattern, Range, Record, RecordField, fields_of
from opsctl.spec import model


def _size_text(value: object) -> object:
    """A size may be written as a plain byte count (maxmemory: 1048576)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _config_value(value: object) -> str | int | bool:
    if isinstance(value, (str, int, bool)) and not isinstance(value, float):
        return value
    raise ValueError(f"must be a string, a whole number or true/false, got {echo(value)} (quote other values)")


SIZE_PATTERN = r"^[0-9]+([bB]|[kKmMgG][bB]?)?$"
# The validation behind each Check marker's name: pydantic metadata of the marked type.
CHECKS: dict[str, tuple[object, ...]] = {
    "size": (BeforeValidator(_size_text, json_schema_input_type=Annotated[
                 str, StringConstraints(pattern=SIZE_PATTERN)] | Annotated[int, Field(ge=0)]),
             StringConstraints(pattern=r"^[0-9]+(b|k|kb|m|mb|g|gb)?$", to_lower=True)),
    "config value": (PlainValidator(_config_value),),
}


class Strict(BaseModel):
    """The base of every derived model: strict types, no unknown field, frozen."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def derive(record: type[Record], models: dict[str, type[Strict]]) -> type[Strict]:
    """The pydantic model of record (and, first, of the records its fields hold), kept in models by name."""
    if record.__name__ not in models:
        fields = {name: (_annotation(f.kind, models), _field_info(f, models))
                  for name, f in fields_of(record).items()}
        models[record.__name__] = create_model(
            record.__name__, __base__=Strict, __doc__=record.__doc__, __module__=__name__,
            __validators__=_checked(record), **fields)  # type: ignore[call-overload]
    return models[record.__name__]


def _annotation(kind: Any, models: dict[str, type[Strict]]) -> Any:
    """kind in pydantic's terms: records as their models, markers as pydantic metadata (Any: a type form)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, Record):
        return derive(kind, models)
    if origin is Annotated:
        metadata = [item for marker in args[1:] for item in _metadata(marker, args[0])]
        inner = _annotation(args[0], models)
        parts = (inner, *metadata)  # Annotated[inner, *metadata], without 3.11's star in a subscript
        return Annotated[parts] if metadata else inner
    if origin is list:
        return list[_annotation(args[0], models)]  # type: ignore[misc]
    if origin is dict:  # keys are text, as JSON's
        return dict[str, _annotation(args[1], models)]  # type: ignore[misc]
    if args and origin is not typing.Literal:  # a union
        return typing.Union[tuple(_annotation(arg, models) for arg in args)]  # noqa: UP007
    return kind


def _metadata(marker: object, base: object) -> tuple[object, ...]:
    if isinstance(marker, Range):
        bounds: dict[str, Any] = {name: value for name, value in (("ge", marker.ge), ("le", marker.le))
                                  if value is not None}
        return (Field(**bounds),)
    if isinstance(marker, Length):
        return (StringConstraints(min_length=marker.min) if base is str else Field(min_length=marker.min),)
    if isinstance(marker, Pattern):
        return (StringConstraints(pattern=marker.regex),)
    if isinstance(marker, Check):
        return CHECKS[marker.name]
    if isinstance(marker, Hidden):  # what errors may quote is the error wording's (opsctl.spec.secretrefs)
        return ()
    raise TypeError(f"no validation for the marker {marker!r}")


def _field_info(declared: RecordField, models: dict[str, type[Strict]]) -> FieldInfo:
    options: dict[str, Any] = {}
    factory = declared.factory
    if isinstance(factory, type) and issubclass(factory, Record):
        options["default_factory"] = derive(factory, models)
    elif factory is not None:
        options["default_factory"] = factory
    elif not declared.required:
        options["default"] = declared.default
    if declared.description is not None:
        options["description"] = declared.description
    info: FieldInfo = Field(**options)
    return info


def _checked(record: type[Record]) -> dict[str, object]:
    """The record's check() as an after-validator of its model, run on the validated fields as plain values."""
    if record.check is Record.check:
        return {}

    def check(self: Strict) -> Strict:
        record.from_json(self.model_dump(mode="json")).check()
        return self

    return {"check": model_validator(mode="after")(check)}


def _derive_all() -> dict[str, type[Strict]]:
    models: dict[str, type[Strict]] = {}
    for value in vars(model).values():
        if isinstance(value, type) and issubclass(value, Record) and value is not Record:
            derive(value, models)
    return models


MODELS = _derive_all()
globals().update(MODELS)  # each model under its record's name, as the records are in opsctl.spec.model
Spec: type[Strict] = MODELS["Spec"]


def spec_schema() -> dict[str, Any]:
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "opsctl topology spec"
    return schema
