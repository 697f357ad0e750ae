"""plan, apply, status and destroy as library operations (issue 34): no CLI, a runtime opened from a spec, typed
results, events to a sink; two topologies applied at once, their events tagged by topology."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from opsctl.apply import ApplyOptions, ApplyResult, apply, plan
from opsctl.apply.executor import StepDone
from opsctl.base.events import Event, Tagged, tagged
from opsctl.destroy import DestroyOptions, destroy
from opsctl.net.fanout import fan_out
from opsctl.runtime.opening import RuntimeOptions, open_runtime
from opsctl.spec.load import LoadedSpec
from opsctl.state.specfile import read_spec
from opsctl.status import status
from tests.support import PASSWORD, PASSWORD_ENV, make_spec, server_binary, write_spec

pytestmark = pytest.mark.integration
FLAVORS = ["valkey", "redis"]

# The library alone, in a fresh process: a plan and a status of the deployed spec, and no CLI module loaded.
ALONE = """
import sys
from opsctl.apply import plan
from opsctl.runtime.opening import open_runtime
from opsctl.state.specfile import read_spec
from opsctl.status import status

with open_runtime(read_spec(sys.argv[1])) as rt:
    assert not plan(rt).changes
    assert status(rt).healthy
cli = sorted(m for m in sys.modules if m == "opsctl.cli" or m.startswith("opsctl.cli."))
assert not cli, cli
"""


class Sink:
    """Every event, in order (thread-safe: steps of several nodes run at once)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_plan_apply_status_destroy_without_the_cli(tmp_path: Path, flavor: str) -> None:
    server_binary(flavor)
    loaded = read_spec(write_spec(tmp_path, make_spec("replication", flavor)))
    sink = Sink()
    try:
        with open_runtime(loaded, RuntimeOptions(locked=True)) as rt:
            assert plan(rt).changes
            result = apply(rt, ApplyOptions(), sink)
            assert result.healthy and result.status is not None
            assert result.steps_run > 0 and result.steps_run == sum(len(r.plan.steps) for r in result.rounds)
            assert len([e for e in sink.events if isinstance(e, StepDone)]) == result.steps_run
        with open_runtime(loaded) as rt:
            assert status(rt).healthy
            assert not plan(rt).changes
        done = subprocess.run([sys.executable, "-c", ALONE, str(tmp_path / "topology.yaml")], capture_output=True,
                              text=True, check=False, env={**os.environ, PASSWORD_ENV: PASSWORD})
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        with open_runtime(loaded) as rt:
            gone = destroy(rt, DestroyOptions(purge=True))
            assert not [n.name for n in rt.loaded.layout.nodes if rt.provider.process_state(n).running]
    assert {n.node for n in gone.nodes} == {n.name for n in loaded.layout.nodes}
    assert all(n.was_running and n.purged for n in gone.nodes)


def test_two_topologies_applied_at_once_tag_their_events(tmp_path: Path) -> None:
    server_binary("valkey")
    specs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        specs.append(read_spec(write_spec(tmp_path / name, make_spec("standalone", "valkey", hosts=1))))
    sink = Sink()

    def one(loaded: LoadedSpec) -> ApplyResult:
        with open_runtime(loaded, RuntimeOptions(locked=True)) as rt:
            return apply(rt, ApplyOptions(), tagged(sink, loaded.spec.name))

    try:
        results = fan_out(one, specs)
        assert [r.spec for r in results] == [s.spec.name for s in specs]
        assert all(r.healthy and r.steps_run > 0 for r in results)
        assert all(isinstance(e, Tagged) for e in sink.events)
        for loaded, result in zip(specs, results, strict=True):
            mine = [e.event for e in sink.events if isinstance(e, Tagged) and e.topology == loaded.spec.name]
            assert len([e for e in mine if isinstance(e, StepDone)]) == result.steps_run
    finally:
        for loaded in specs:
            with open_runtime(loaded) as rt:
                destroy(rt, DestroyOptions(purge=True))
