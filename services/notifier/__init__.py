"""The notifier: delivers approval notifications from their outbox (issue 42)."""
