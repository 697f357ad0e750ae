"""`opsctl audit`: the Redis development standard checked on live nodes, and safe big-key deletion.

Pure rules: keynames, keyspace, nodechecks, report (findings: opsctl.observe.findings). Thin I/O: scan, probe, run,
bigdelete, throttle. This package imports none of them: import each module itself, so that a command loads only what
it uses (bigdelete brings redis-py)."""
