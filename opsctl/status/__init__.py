"""The status operation: a look at every node of a runtime, settled or watched (opsctl.status.looks)."""

from opsctl.status.looks import StatusOptions, StatusResult, status, watch

__all__ = ["StatusOptions", "StatusResult", "status", "watch"]
