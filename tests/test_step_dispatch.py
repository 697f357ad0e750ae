"""The typed step dispatch (issue 34 WP4): every step type has one handler that takes exactly that type, but
StartNode, which the executor starts with the rest of its wave; a step reaches a handler of its own type only."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from opsctl.apply.executor import HANDLERS
from opsctl.base.events import ignore
from opsctl.plan.steps import STEP_TYPES, StartNode, StopNode, WriteConfig
from opsctl.runtime.execution import Execution, Handler, handles, registry


def test_every_step_type_is_handled_or_started_together() -> None:
    assert StartNode not in HANDLERS, "StartNode runs in _start_together: a handler for it is never reached"
    assert set(HANDLERS) | {StartNode} == set(STEP_TYPES.values())


def test_each_handler_takes_exactly_its_step_type() -> None:
    handlers = [h for h in HANDLERS.values() if isinstance(h, Handler)]
    assert len(handlers) == len(HANDLERS)
    wrong = [f"{h.do.__module__}.{h.do.__name__} takes {get_type_hints(h.do)['step']}, not {h.step_type.__name__}"
             for h in handlers if get_type_hints(h.do)["step"] is not h.step_type]
    assert not wrong, wrong
    assert all(HANDLERS[step_type].step_type is step_type for step_type in HANDLERS)


def test_a_step_reaches_only_a_handler_of_its_type() -> None:
    seen: list[StopNode] = []

    def stop(run: Execution, step: StopNode) -> None:
        seen.append(step)

    handler = handles(StopNode, stop)
    run = Execution(None, ignore)  # type: ignore[arg-type]  # the handler here reads no runtime
    handler.run_step(run, StopNode("a", "test"))
    assert seen == [StopNode("a", "test")]
    with pytest.raises(TypeError, match="WriteConfig step was dispatched to the StopNode handler"):
        handler.run_step(run, WriteConfig("a", "test"))


def test_a_step_type_handled_twice_is_refused() -> None:
    def stop(run: Execution, step: StopNode) -> None:
        pass

    with pytest.raises(ValueError, match="handled twice: StopNode"):
        registry(handles(StopNode, stop), handles(StopNode, stop))
