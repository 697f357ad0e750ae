"""`opsctl audit`: the Redis development standard checked on live nodes, and safe big-key deletion.

Pure rules: keynames, keyspace, nodechecks, formats (findings: opsctl.observe.findings). Thin I/O: scan (with its
throttle), probe, survey, bigdelete. This package imports none of them: import each module itself, so that a
command loads only what it uses (bigdelete brings redis-py)."""
