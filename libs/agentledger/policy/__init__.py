"""What agents may do: the versioned action allowlist (R1.2, R1.3)."""
