"""The stop request (opsctl.base.stop): SIGTERM/SIGINT raise Stopped at once outside a finishing region; inside
one the first signal only asks (engines poll check()), the region's end raises it, a second signal raises at once;
exit codes are 128 + the signal's number; the previous handlers come back."""

from __future__ import annotations

import os
import signal

import pytest

from opsctl.base import stop


def test_a_signal_outside_a_region_stops_at_once_with_its_exit_code() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(stop.Stopped) as raised, stop.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between two bytecodes of this thread
            pass
    assert raised.value.exit_code == 143 and raised.value.summary == "stopped on SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before and stop.requested() is None


def test_inside_a_region_the_first_signal_asks_and_the_second_interrupts() -> None:
    with stop.installed():
        with pytest.raises(stop.Stopped) as ended, stop.finishing("the move"):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            assert stop.requested() == signal.SIGINT  # asked, not raised: the step in flight goes on
            with pytest.raises(stop.Stopped, match="SIGINT"):
                stop.check("moved 3 of 5")
        assert ended.value.exit_code == 130 and "finished" in ended.value.detail
        with pytest.raises(stop.Stopped), stop.finishing("another"):
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal: at once, even in a region
            for _ in range(100000):
                pass
            raise AssertionError("not interrupted")


def test_check_is_silent_without_a_request() -> None:
    with stop.installed(), stop.finishing("nothing asked"):
        stop.check()
