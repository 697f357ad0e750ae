"""A standby topology (docs/standby.md): a migration that never ends until asked, with a way back."""
