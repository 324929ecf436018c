"""Dispatching commands to connectors: claim, check, call, record (SPEC R2.6, R5, R6)."""
