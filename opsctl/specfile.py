"""The I/O edge of spec loading: read the file, resolve secrets from the environment and from files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from opsctl.errors import OpsctlError
from opsctl.secrets import read_secret_file, remember
from opsctl.spec.load import LoadedSpec, load_spec, make_resolver


def read_spec(path: str | Path, env: Mapping[str, str] | None = None) -> LoadedSpec:
    spec_path = Path(path)
    try:
        text = spec_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OpsctlError(f"spec file not found: {spec_path}", hint="pass the topology file with -f") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OpsctlError(f"cannot read spec file {spec_path}", str(exc)) from None

    def read_file(name: str) -> str | None:
        secret_path = Path(name) if Path(name).is_absolute() else spec_path.parent / name
        try:
            return read_secret_file(secret_path) or None
        except OSError:
            return None

    loaded = load_spec(text, str(spec_path), make_resolver(os.environ if env is None else env, read_file))
    for secret in loaded.credentials.all():
        remember(secret)
    return loaded
