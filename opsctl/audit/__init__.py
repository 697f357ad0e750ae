"""`opsctl audit`: the Redis development standard checked on live nodes, and safe big-key deletion.

Pure rules: findings, keynames, keyspace, nodechecks, report, resp. Thin I/O: pipe, discover, scan, probe,
run, bigdelete.

Import the modules themselves: this package imports none of them, so the raw pipe (pipe, resp), which node
observation and restore use too, comes without the audit's rules and redis-py.
"""
