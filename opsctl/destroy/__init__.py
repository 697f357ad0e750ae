"""The destroy operation: stop, and with purge delete, every node of a runtime (opsctl.destroy.teardown)."""

from opsctl.destroy.teardown import DestroyOptions, DestroyResult, NodeTeardown, destroy

__all__ = ["DestroyOptions", "DestroyResult", "NodeTeardown", "destroy"]
