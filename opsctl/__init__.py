"""opsctl: declarative Redis and Valkey fleets."""

__version__ = "0.1.0"
