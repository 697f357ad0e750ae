"""Backups: one verified RDB per shard and a manifest (opsctl backup, opsctl backup verify)."""
