"""Restores: keys from a backup or a running topology into a running topology of any shape."""
