"""The audit ledger and `explain` (SPEC R8.4, R8.6)."""
