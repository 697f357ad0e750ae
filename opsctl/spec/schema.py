"""JSON Schema of the spec, for editors (yaml-language-server) and CI."""

from __future__ import annotations

from typing import Any

from opsctl.spec.pydantic_model import Spec


def spec_schema() -> dict[str, Any]:
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "opsctl topology spec"
    return schema
