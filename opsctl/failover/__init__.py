"""Runbook-driven manual failover: pure checks and report model (checks, report), thin I/O runner (runbook)."""
