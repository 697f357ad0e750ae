"""A short, stable digest of JSON-able data: plans, rendered files, specs and fingerprints are compared by it."""

from __future__ import annotations

import hashlib
import json


def digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
