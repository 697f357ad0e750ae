"""The replication stream's pure parts: framing with byte counts, PSYNC replies, snapshot headers, gap reasons."""

from __future__ import annotations

import pytest

from opsctl.net.resp import encode
from opsctl.stream.framing import (
    Position,
    StreamProtocolError,
    frame,
    gap_reason,
    parse_bulk_header,
    parse_psync_reply,
    position_from,
    psync_args,
)

ID = "a" * 40


def test_frame_counts_bytes_and_keeps_a_cut_command_for_later() -> None:
    one, two = encode([b"SET", b"k", b"v\r\n"]), encode([b"PING"])
    data = one + two + encode([b"DEL", b"x"])[:-3]
    framed, used = frame(data, 0)
    assert framed == [((b"SET", b"k", b"v\r\n"), len(one)), ((b"PING",), len(two))]
    assert used == len(one) + len(two)
    assert frame(b"*2\r\n$3\r\nDEL", 0) == ([], 0)


def test_frame_refuses_what_is_not_an_array() -> None:
    with pytest.raises(StreamProtocolError):
        frame(b"+OK\r\n", 0)


def test_psync_words() -> None:
    assert psync_args(None) == (b"PSYNC", b"?", b"-1")
    assert psync_args(Position(ID, 99)) == (b"PSYNC", ID.encode(), b"100")
    assert parse_psync_reply(b"+FULLRESYNC " + ID.encode() + b" 7") == ("FULLRESYNC", ID, 7)
    assert parse_psync_reply(b"+CONTINUE " + ID.encode()) == ("CONTINUE", ID, None)
    assert parse_psync_reply(b"+CONTINUE") == ("CONTINUE", "", None)
    with pytest.raises(StreamProtocolError):
        parse_psync_reply(b"-NOPERM")


def test_snapshot_headers() -> None:
    assert parse_bulk_header(b"$123") == (123, None)
    assert parse_bulk_header(b"$EOF:" + b"m" * 40) == (None, b"m" * 40)
    with pytest.raises(StreamProtocolError):
        parse_bulk_header(b"+OK")


def test_gap_reasons() -> None:
    info = {"master_replid": ID, "master_replid2": "b" * 40, "second_repl_offset": "50"}
    assert gap_reason(Position(ID, 10), info) == "backlog overrun"
    assert gap_reason(Position("b" * 40, 49), info) == "backlog overrun"
    assert gap_reason(Position("b" * 40, 50), info) == "history changed"
    assert gap_reason(Position("c" * 40, 1), info) == "history changed"


def test_positions_round_trip_and_bad_ones_are_named() -> None:
    assert position_from(Position(ID, 5).to_json(), "j") == Position(ID, 5)
    with pytest.raises(StreamProtocolError, match="j: not a replication position"):
        position_from({"replid": "short", "offset": 1}, "j")


def test_a_silent_link_is_lost_not_waited_on_and_a_ping_keeps_it() -> None:
    """A split drops packets without a word: a link that hears nothing (not even the master's PINGs) for
    silent_after is lost (PipeClosed: the caller attaches again), where it waited for TCP's ~15 minutes."""
    import socket
    import time

    from opsctl.base.errors import PipeClosed
    from opsctl.stream.reader import Stream

    ours, theirs = socket.socketpair()
    with Stream(ours, "node-1") as stream, theirs:
        stream.silent_after = 1.0
        theirs.sendall(encode([b"PING"]))
        assert [e.args for e in stream.read(0.05)] == [(b"PING",)]
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # heard lately: no error yet
            assert stream.read(0.05) == []
        theirs.sendall(encode([b"PING"]))
        assert len(stream.read(0.05)) == 1  # a PING keeps it
        with pytest.raises(PipeClosed, match="sent nothing on the replication link"):
            for _ in range(200):
                stream.read(0.05)
