"""opsctl: declarative Redis and Valkey fleets.

Where the data files shipped with opsctl live: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


_PACKAGE = Path(__file__).resolve().parent  # opsctl/


def data_dir(name: str) -> Path:
    """templates/, playbooks/, examples/ or monitoring/: the installed copy if present, else the checkout's."""
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def monitoring_files() -> list[tuple[Path, str]]:
    """(shipped file, its name inside `opsctl metrics rules --dir DIR`): the alert rules, their promtool tests in
    tests/ (each names ../alerts.yml, so they run where they are written), the Grafana dashboard."""
    root = data_dir("monitoring")
    files = [(root / "prometheus" / "alerts.yml", "alerts.yml")]
    files += [(p, f"tests/{p.name}") for p in sorted((root / "prometheus" / "tests").glob("*.yml"))]
    return files + [(p, p.name) for p in sorted((root / "grafana").glob("*.json"))]
