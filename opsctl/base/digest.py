"""A short, stable digest of JSON-able data: plans, rendered files, specs and fingerprints are compared by it."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
