"""Providers put files on hosts and start/stop servers. They know nothing about slots or replication."""
