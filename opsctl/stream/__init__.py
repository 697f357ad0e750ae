"""The replication-stream reader (live migration, point-in-time recovery): opsctl.stream.reader; the pure parts
are opsctl.stream.framing."""

from opsctl.stream.framing import Entry, Position
from opsctl.stream.reader import Stream, StreamGap, open_stream

__all__ = ["Entry", "Position", "Stream", "StreamGap", "open_stream"]
