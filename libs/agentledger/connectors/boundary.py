"""The one boundary between what a provider answers and what the ledger records (R14, STYLE 21).

A provider is as untrusted as the model. Whatever it answers (any status, redirect, byte,
field type or size, any timing) and whatever a connector makes of it (returns, raises,
hangs), the executor, the reconciler, an operator's check and the conformance kit receive one
of a closed set of outcomes, every text in it storable by the ledger:

- ``execute`` → ``Applied`` (a storable, bounded, non-empty receipt), ``PreconditionFailed``,
  ``Refused``, ``Fenced``, ``NotSent`` or ``InDoubt``;
- ``lookup`` → ``Applied``, ``NotFound`` or ``InDoubt``;
- ``fence`` → ``Advanced``, or why not (``Refused``, ``NotSent``, ``InDoubt``).

An exception, a hang past the call bound, or a value of any other type is ``InDoubt``: the
request may have left, so nothing is concluded from it. Nothing raised inside a connector
crosses this line but cancellation (the caller's own), so no answer can stop a ledger write,
a batch or a reconciler's sweep. The connector SDK gives every connector this, ours and
users' alike; a connector's own classification (``crm``, ``agentledger_http``) still decides
what each status means.

Written here rather than taken from a library: it is the closed set of outcomes of
:mod:`agentledger.connectors.base` and the ledger's text rules, nothing generic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

from agentledger.connectors import base
from agentledger.contracts import common, outcomes
from agentledger.telemetry import metrics as telemetry_metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# An HTTP status as the ledger keeps it on a refusal; anything else is kept as 0 (unknown).
_STATUSES = range(100, 600)


def reason(value: object, fallback: str) -> str:
    """A reason from outside as the ledger keeps it: storable, bounded, never empty."""
    text = common.reason_text(value).strip()
    return text or fallback


def result(found: object, call: base.Call, *, connector: str) -> base.Result:
    """What ``execute`` returned, rebuilt from its fields with storable text; anything that
    is not a result is ``InDoubt``."""
    if isinstance(found, base.Applied):
        return base.Applied(outcomes.receipt_text(found.receipt, call.idempotency_key),
                            replayed=found.replayed is True)
    if isinstance(found, base.PreconditionFailed):
        return base.PreconditionFailed(reason(found.reason, "the provider's precondition failed"))
    if isinstance(found, base.Refused):
        status = found.status if type(found.status) is int and found.status in _STATUSES else 0
        return base.Refused(reason(found.reason, "the provider refused the request"), status)
    if isinstance(found, base.Fenced):
        return base.Fenced(reason(found.reason, "the provider refused a stale fencing token"))
    if isinstance(found, base.NotSent):
        return base.NotSent(reason(found.reason, "the request was not sent"))
    if isinstance(found, base.InDoubt):
        return base.InDoubt(reason(found.reason, "no definitive answer"))
    return _unclassified(connector, "execute", f"the {connector} connector answered a "
                         f"{type(found).__name__}, not a result")


def looked_up(found: object, call: base.Call, *, connector: str) -> base.Lookup:
    """What ``lookup`` returned, rebuilt with storable text; anything else is ``InDoubt``."""
    if isinstance(found, base.Applied):
        return base.Applied(outcomes.receipt_text(found.receipt, call.idempotency_key),
                            replayed=found.replayed is True)
    if isinstance(found, base.NotFound):
        return base.NotFound(reason(found.reason, base.NotFound.reason))
    if isinstance(found, base.InDoubt):
        return base.InDoubt(reason(found.reason, "the lookup gave no definitive answer"))
    return _unclassified(connector, "lookup", f"the {connector} lookup answered a "
                         f"{type(found).__name__}, not a lookup result")


def fenced(found: object, call: base.Call, *, connector: str) -> base.FenceResult:
    """What ``fence`` returned; ``Advanced`` only for at least the generation asked for."""
    if isinstance(found, base.Advanced):
        wanted = call.fencing_generation or 0
        if type(found.generation) is int and found.generation >= wanted:
            return base.Advanced(found.generation)
        return base.InDoubt(f"the {connector} fence answered generation {found.generation!r}, "
                            f"below the {wanted} asked for")
    if isinstance(found, base.Refused | base.NotSent | base.InDoubt):
        return result(found, call, connector=connector)  # type: ignore[return-value]
    return _unclassified(connector, "fence", f"the {connector} fence answered a "
                         f"{type(found).__name__}, not a fence result")


def _unclassified(connector: str, operation: str, why: str) -> base.InDoubt:
    telemetry_metrics.unclassified_answers.add(
        1, connector=telemetry_metrics.bounded(connector), stage=operation)
    log.warning("event=provider_answer_unclassified connector=%s operation=%s", connector,
                operation)
    return base.InDoubt(common.reason_text(f"{why}: nothing is concluded from it"))


async def _bounded(connector: base.Connector, operation: str, call: base.Call,
                   work: Awaitable[T], bound_s: float) -> T | base.InDoubt:
    """Await ``work`` within ``bound_s``; a hang or any exception is ``InDoubt``."""
    try:
        async with asyncio.timeout(bound_s) as timer:
            return await work
    except TimeoutError:
        if timer.expired():
            return base.InDoubt(f"no answer within the call bound ({bound_s:g} s)")
        return _raised(connector, operation, call, TimeoutError())
    except Exception as exc:  # the boundary: nothing from a provider crosses it
        return _raised(connector, operation, call, exc)


def _raised(connector: base.Connector, operation: str, call: base.Call,
            exc: BaseException) -> base.InDoubt:
    name = getattr(connector, "name", "?")
    telemetry_metrics.unclassified_answers.add(
        1, connector=telemetry_metrics.bounded(name), stage=operation)
    log.warning("event=connector_raised connector=%s operation=%s operation_id=%s error=%s",
                name, operation, call.operation_id, type(exc).__name__, exc_info=exc)
    return base.InDoubt(common.reason_text(
        f"the {name} connector raised {type(exc).__name__} during {operation}: the request "
        "may have reached the provider"))


async def execute(connector: base.Connector, call: base.Call, token: str, *,
                  bound_s: float) -> base.Result:
    """``connector.execute`` within the call bound, its answer classified (module docstring)."""
    found = await _bounded(connector, "execute", call, connector.execute(call, token), bound_s)
    return result(found, call, connector=connector.name)


async def lookup(connector: base.Connector, call: base.Call, token: str, *,
                 bound_s: float) -> base.Lookup:
    """``connector.lookup`` within the call bound, its answer classified."""
    found = await _bounded(connector, "lookup", call, connector.lookup(call, token), bound_s)
    return looked_up(found, call, connector=connector.name)


def can_fence(connector: base.Connector) -> bool:
    """Whether the connector declares fencing and offers ``fence`` to advance it."""
    return connector.contract.fencing and callable(getattr(connector, "fence", None))


async def fence(connector: base.Connector, call: base.Call, token: str, *,
                bound_s: float) -> base.FenceResult:
    """Advance the provider's fence for ``call``'s key to ``call.fencing_generation``.

    Returns ``Advanced`` only when the provider confirmed a fence at least that high; a
    connector that cannot fence answers ``NotSent`` (nothing was asked of the provider).
    """
    if not can_fence(connector):
        return base.NotSent(f"the {connector.name} connector cannot advance a fence")
    fencer: base.Fencer = connector  # type: ignore[assignment]
    found = await _bounded(connector, "fence", call, fencer.fence(call, token), bound_s)
    return fenced(found, call, connector=connector.name)
