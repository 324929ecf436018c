"""Connectors: the only code that calls business systems, each with a declared contract (R6.7)."""
