"""Who is told about a pending approval, and through what (issue 42 item 1).

The operator's approval file (``AGENTLEDGER_APPROVALS``) in format
``agentledger.approvals.v2`` adds routing to the N-of-M rules of
:mod:`agentledger.approvals.quorum` (a v1 file stays valid and routes nowhere):

- ``channels``: named notifier plugins with their options, e.g.
  ``{"ops-hook": {"plugin": "webhook", "options": {"secret_env": "AGENTLEDGER_NOTIFY_OPS"}}}``
  (plugins are entry points of group ``agentledger.notifiers``: :mod:`agentledger.notify.plugins`);
- per group, ``channels`` (the names it is reached through) and ``contacts`` (per member, an
  ``email`` address and/or a ``webhook`` URL);
- per rule, ``escalate_to`` (a group) and ``escalate_after`` (a duration: ``"PT1H"`` or seconds).

The rule matcher that sets a request's quorum routes it: the first matching rule's group is
notified when the request is created; its ``escalate_to`` group once the window has passed.
A request no rule matches is notified to nobody (a person finds it in the console, as before).

Secrets are never in the file: a channel names the environment variable that holds its
signing secret (``secret_env``), and a missing one is a problem, like any other here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentledger import errors
from agentledger.notify import plugins

if TYPE_CHECKING:
    from agentledger.approvals.quorum import ApprovalRules

Address = Annotated[str, Field(min_length=3, max_length=2000)]
Kind = Literal["requested", "escalated", "expired"]


class Contact(BaseModel):
    """Where one member is reached: an e-mail address and/or a webhook URL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    email: Annotated[str, Field(min_length=3, max_length=320, pattern=r"^[^@\s<>]+@[^@\s<>]+$")
                     ] | None = None
    webhook: Address | None = None

    def address(self, kind: plugins.ContactKind) -> str | None:
        return self.email if kind == "email" else self.webhook


class Channel(BaseModel):
    """A named notifier plugin and its options (never a secret: ``secret_env`` names one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plugin: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
    options: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Recipient:
    """One notification to write: a member, a channel, the address the channel uses."""

    member: str
    channel: str
    address: str


def _routed(found: ApprovalRules) -> bool:
    return bool(found.channels or any(g.channels or g.contacts for g in found.groups.values())
                or any(r.escalate_to or r.escalate_after for r in found.rules))


def problems(found: ApprovalRules, *, build: bool = True,
             make: plugins.Make | None = None) -> list[str]:
    """What cannot work in the file's routing: every problem, each naming where.

    With ``build``, each channel's notifier is built (``make``, default the installed
    plugins), so a missing secret or a bad option is found here, not at the first
    notification: check-config and the notifier. Without, only that each plugin is
    installed: admission, which writes the notifications and never holds a signing secret.
    """
    make = make or plugins.make
    out: list[str] = []
    if _routed(found) and found.format != "agentledger.approvals.v2":
        out.append(f"approvals: channels, contacts and escalation need format "
                   f"agentledger.approvals.v2 (this file is {found.format})")
    contact_kinds: dict[str, plugins.ContactKind] = {}
    for name, channel in sorted(found.channels.items()):
        try:
            contact_kinds[name] = (make(channel.plugin, channel.options).contact if build
                                   else plugins.declared_contact(channel.plugin))
        except errors.ConfigurationError as exc:
            out.append(f"approval channel {name}: {exc.message}")
    for gname, group in sorted(found.groups.items()):
        where = f"approval group {gname}"
        for stranger in sorted(set(group.contacts) - set(group.members)):
            out.append(f"{where}: contact for {stranger}, who is not a member")
        for cname in group.channels:
            if cname not in found.channels:
                out.append(f"{where}: unknown channel {cname!r} (declared: "
                           f"{sorted(found.channels)})")
                continue
            kind = contact_kinds.get(cname)
            if kind is None:
                continue  # the channel's own problem is named above
            for member in group.members:
                contact = group.contacts.get(member)
                address = contact.address(kind) if contact else None
                if address is None:
                    out.append(f"{where}: {member} has no {kind} contact for channel {cname}")
                elif kind == "webhook" and not address.startswith(("http://", "https://")):
                    out.append(f"{where}: {member}'s webhook {address!r} is not an http(s) URL")
    for rule in found.rules:
        where = f"approval rule {rule.name}"
        if (rule.escalate_to is None) != (rule.escalate_after is None):
            out.append(f"{where}: escalate_to and escalate_after go together")
            continue
        if rule.escalate_to is None or rule.escalate_after is None:
            continue
        if rule.escalate_after.total_seconds() <= 0:
            out.append(f"{where}: escalate_after must be a positive duration")
        target = found.groups.get(rule.escalate_to)
        if target is None:
            out.append(f"{where}: escalate_to names unknown group {rule.escalate_to!r}")
        elif rule.escalate_to == rule.group:
            out.append(f"{where}: escalates to its own group {rule.group} (a cycle)")
        else:
            asked = found.groups.get(rule.group)
            if asked is not None and asked.role != target.role:
                # The escalated group's members decide under the request's role: a group of
                # another role could be told but could never decide.
                out.append(f"{where}: escalates to group {rule.escalate_to} of role "
                           f"{target.role!r}, but the request needs role {asked.role!r}")
            if rule.required > len(target.members):
                out.append(f"{where}: needs {rule.required} approvers but escalation group "
                           f"{rule.escalate_to} has {len(target.members)}")
    return out


def recipients(found: ApprovalRules, group: str | None,
               kinds: Mapping[str, plugins.ContactKind]) -> list[Recipient]:
    """Every (member, channel, address) of ``group`` (none for no group), in file order.

    ``kinds`` is each channel's contact kind (:attr:`plugins.Notifier.contact`); a member
    without an address for a channel is skipped (check-config names it; the services refuse
    to start on it, so this only happens with an unchecked file).
    """
    asked = found.groups.get(group) if group else None
    if asked is None:
        return []
    out: list[Recipient] = []
    for member in asked.members:
        contact = asked.contacts.get(member)
        for cname in asked.channels:
            kind = kinds.get(cname)
            address = contact.address(kind) if contact and kind else None
            if address is not None:
                out.append(Recipient(member, cname, address))
    return out


def contact_kinds(found: ApprovalRules) -> dict[str, plugins.ContactKind]:
    """Each channel's contact kind, from its plugin's declaration (no notifier is built).

    Raises:
        ConfigurationError: a channel's plugin is not installed.
    """
    return {name: plugins.declared_contact(c.plugin) for name, c in found.channels.items()}


__all__ = ["Channel", "Contact", "Kind", "Recipient", "contact_kinds", "problems",
           "recipients"]
