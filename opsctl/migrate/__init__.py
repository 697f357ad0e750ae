"""Live migration: a running topology followed through its replication stream into any target shape."""
