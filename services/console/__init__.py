"""The approvals console: server-rendered pages and a JSON API for human approvals (R2.4)."""
