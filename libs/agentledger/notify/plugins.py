"""Notifier plugins: how a notification reaches a person (issue 42 item 1).

A distribution offers notifiers in its metadata, like connectors::

    [project.entry-points."agentledger.notifiers"]
    pager = "acme_pager:PagerNotifier"     # a class: contact, from_options, send, aclose

and the operator's approval file names channels that use them (:mod:`agentledger.notify.routing`).
This distribution ships ``webhook`` (:mod:`agentledger.notify.webhook`) and ``email``
(:mod:`agentledger.notify.email`).

The contract, checked by :mod:`agentledger.notify.conformance`: ``send`` carries the
notification's idempotency key where the receiver sees it (a header, a Message-ID) and the
same key on every redelivery, so a receiver that dedupes by it sees each notification once;
and ``send`` classifies whatever comes back into a :class:`Delivery` — it never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal, Protocol
from uuid import UUID

from agentledger import errors

GROUP = "agentledger.notifiers"
ContactKind = Literal["email", "webhook"]
Outcome = Literal["sent", "retry", "permanent"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """One message to one person about one approval request (never its arguments)."""

    key: str  # stable: approval id + recipient + channel + kind (agentledger.notify.outbox)
    kind: Literal["requested", "escalated", "expired"]
    tenant_id: UUID
    approval_id: UUID
    operation_id: UUID
    action: str
    group: str
    recipient: str  # the member's principal id
    address: str  # where the channel sends: an e-mail address or a webhook URL
    link: str  # opens this request in the console
    required_approvals: int
    expires_at: datetime

    def document(self) -> dict[str, Any]:
        """The JSON a receiver gets (the webhook's body; the e-mail's facts)."""
        return {"key": self.key, "kind": self.kind, "tenant_id": str(self.tenant_id),
                "approval_id": str(self.approval_id), "operation_id": str(self.operation_id),
                "action": self.action, "group": self.group, "recipient": self.recipient,
                "link": self.link, "required_approvals": self.required_approvals,
                "expires_at": self.expires_at.isoformat()}


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one attempt came to: ``sent``; ``retry`` (maybe later); ``permanent`` (never)."""

    outcome: Outcome
    detail: str


class Notifier(Protocol):
    """A channel's sender."""

    contact: ClassVar[ContactKind]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Notifier:
        """Raises ConfigurationError naming the option (a missing secret, a bad port)."""
        ...

    async def send(self, notification: Notification) -> Delivery: ...

    async def aclose(self) -> None: ...


Make = Callable[[str, Mapping[str, Any]], Notifier]


def _plugin(name: str) -> type[Notifier]:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        raise errors.ConfigurationError(
            f"unknown plugin {name!r} (installed: {sorted(found)})", plugin=name)
    loaded = found[name].load()
    if not isinstance(loaded, type) or getattr(loaded, "contact", None) not in (
            "email", "webhook") or not callable(getattr(loaded, "from_options", None)):
        raise errors.ConfigurationError(f"plugin {name!r} is not a notifier class", plugin=name)
    plugin: type[Notifier] = loaded
    return plugin


def declared_contact(name: str) -> ContactKind:
    """The contact kind plugin ``name`` sends to. Raises ConfigurationError: not installed."""
    return _plugin(name).contact


def make(name: str, options: Mapping[str, Any]) -> Notifier:
    """A notifier of plugin ``name`` with these options.

    Raises:
        ConfigurationError: not installed, or its options cannot work.
    """
    return _plugin(name).from_options(options)


__all__ = ["GROUP", "ContactKind", "Delivery", "Make", "Notification", "Notifier", "Outcome",
           "declared_contact", "make"]
