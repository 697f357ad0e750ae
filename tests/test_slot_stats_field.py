"""cluster.slot_stats: rendered as cluster-slot-stats-enabled yes where the server has it, refused where not; the
spelled-out config keeps working (one directive, the config's)."""

from __future__ import annotations

import pytest

from opsctl.base.errors import OpsctlError
from opsctl.spec.load import load_spec, make_resolver
from tests.test_render_golden import GOLDEN, SECRETS
from tests.test_render_safety import directive_names, render_all


def loaded_with(case: str, extra: str, section: str = "cluster"):
    text = (GOLDEN / case / "spec.yaml").read_text()
    assert f"\n{section}:\n" in text
    text = text.replace(f"\n{section}:\n", f"\n{section}:\n{extra}", 1)
    return load_spec(text, "spec.yaml", make_resolver(SECRETS, lambda _name: None))


def stats_lines(loaded) -> list[str]:
    files = render_all(loaded)
    return [line for rel, text in files.items() if rel.endswith(".conf") for line in text.splitlines()
            if line.startswith("cluster-slot-stats-enabled")]


def test_slot_stats_renders_on_valkey() -> None:
    loaded = loaded_with("cluster-valkey-password", "  slot_stats: true\n")
    lines = stats_lines(loaded)
    assert lines and set(lines) == {"cluster-slot-stats-enabled yes"}
    assert stats_lines(loaded_with("cluster-valkey-password", "")) == []  # off: rendered as before


def test_the_spelled_out_config_keeps_working_once() -> None:
    spelled = '  cluster-slot-stats-enabled: "yes"\n'
    loaded = loaded_with("cluster-valkey-password", spelled, "config")
    assert set(stats_lines(loaded)) == {"cluster-slot-stats-enabled yes"}
    text = (GOLDEN / "cluster-valkey-password" / "spec.yaml").read_text()
    text = text.replace("\nconfig:\n", f"\nconfig:\n{spelled}")
    text = text.replace("\ncluster:\n", "\ncluster:\n  slot_stats: true\n")
    both = load_spec(text, "spec.yaml", make_resolver(SECRETS, lambda _name: None))
    names = directive_names(render_all(both))
    assert all(n.count("cluster-slot-stats-enabled") == 1 for rel, n in names.items() if rel.endswith(".conf"))


def test_slot_stats_is_refused_on_redis() -> None:
    with pytest.raises(OpsctlError) as err:
        loaded_with("cluster-redis-password", "  slot_stats: true\n")
    text = err.value.render()
    assert "slot_stats" in text and "keeps no per-slot statistics" in text and "Valkey 8.0" in text
