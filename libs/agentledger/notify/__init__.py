"""Notifications of pending approvals: routing, an outbox of their own, notifier plugins,
escalation (issue 42 items 1 and 3). See docs/approvals.md.

``from agentledger.notify import outbox`` → ``outbox.claim(...)``, ``outbox.mark_sent(...)``.
"""
