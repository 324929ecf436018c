"""Spans: controlled attribute names, W3C context from ledger rows, links (R8.1, R8.2, R8.5).

What goes into a span is decided here: ids and bounded names only. Failures are recorded as
the error's stable code, never its message or a stack trace, because messages can quote
inputs. The operation id is a *trace attribute* (``agentledger.operation_id``), which is
allowed; it must never become a metric label (see ``telemetry.metrics``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from agentledger.telemetry import unrecorded

OPERATION_ID: Final = "agentledger.operation_id"
ACTION: Final = "agentledger.action"
CONNECTOR: Final = "agentledger.connector"
STATE: Final = "agentledger.state"
OUTCOME: Final = "agentledger.outcome"
GENERATION: Final = "agentledger.fencing_generation"
STAGE: Final = "agentledger.stage"
ATTEMPT_KIND: Final = "agentledger.attempt.kind"
ATTEMPT_ID: Final = "agentledger.attempt.id"
EFFECT: Final = "agentledger.decision.effect"
POLICY_VERSION: Final = "agentledger.policy_version"
LINK_REASON: Final = "agentledger.link"
ERROR_TYPE: Final = "error.type"

# The tracestate member naming the context a resumed trace continues from (an approval
# request): ``agentledger=<trace-id>-<span-id>``. The executor turns it into a span link.
RESUMED_KEY: Final = "agentledger"

# Pass as ``context`` to start a new trace (work that resumes others links to them instead).
ROOT: Final = Context()

_PROPAGATOR = TraceContextTextMapPropagator()
P = ParamSpec("P")
T = TypeVar("T")


def context_from(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """The remote context a stored or received ``traceparent`` names; None if absent or bad."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    ctx = _PROPAGATOR.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def span_context_from(traceparent: str | None) -> SpanContext | None:
    """The span context of a stored ``traceparent``; None if absent or malformed."""
    ctx = context_from(traceparent)
    return None if ctx is None else trace.get_current_span(ctx).get_span_context()


def parent(traceparent: str | None, tracestate: str | None = None) -> Context | None:
    """Where a span started from a record or row hangs: under the active span when there is
    one (FastStream's process span already continues the record's context), else under the
    given context. ``None`` means "the current context" to the tracer."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    return context_from(traceparent, tracestate)


def traceparent_of(span: Span | None = None) -> str | None:
    """The W3C ``traceparent`` of ``span`` (the current span by default); None if invalid."""
    ctx = (span or trace.get_current_span()).get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def link(traceparent: str | None, reason: str) -> Link | None:
    """A link to the span a stored ``traceparent`` names, tagged with why; None if absent."""
    ctx = span_context_from(traceparent)
    return None if ctx is None else Link(ctx, {LINK_REASON: reason})


def add_link(span: Span, traceparent: str | None, reason: str) -> None:
    """Link ``span`` to a stored context after it started (when the origin is read later)."""
    ctx = span_context_from(traceparent)
    if ctx is not None:
        span.add_link(ctx, {LINK_REASON: reason})


def resumed_state(origin_traceparent: str | None, tracestate: str | None) -> str | None:
    """``tracestate`` with our member naming ``origin_traceparent`` put first (W3C: an
    updated member moves to the front; at most 32 members)."""
    origin = span_context_from(origin_traceparent)
    members = [m.strip() for m in (tracestate or "").split(",")
               if m.strip() and not m.strip().startswith(RESUMED_KEY + "=")]
    if origin is None:
        return ",".join(members) or None
    own = f"{RESUMED_KEY}={origin.trace_id:032x}-{origin.span_id:016x}"
    return ",".join([own, *members[:31]])


def resume(origin_traceparent: str | None,
           origin_tracestate: str | None) -> tuple[str | None, str | None]:
    """The context to store on work that resumes a paused one (an approved command): the
    current span's, with a tracestate member naming the origin; the origin's own context
    when nothing is traced here."""
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return origin_traceparent, origin_tracestate
    return traceparent_of(), resumed_state(origin_traceparent, current.trace_state.to_header())


def resumed_link(state: TraceState | None = None) -> Link | None:
    """The link to the context a resumed trace continues from, read from the current span's
    (or the given) tracestate; None for a trace that was never paused."""
    if state is None:
        state = trace.get_current_span().get_span_context().trace_state
    value = state.get(RESUMED_KEY)
    if not value or "-" not in value:
        return None
    trace_id, span_id = value.split("-", 1)
    return link(f"00-{trace_id}-{span_id}-01", "approval_request")


def failed(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed with the error's stable code only (messages may quote inputs)."""
    code = getattr(exc, "code", None)
    name = code if isinstance(code, str) else type(exc).__name__
    span.set_attribute(ERROR_TYPE, name)
    span.set_status(Status(StatusCode.ERROR, name))


@contextmanager
def span(
    tracer: trace.Tracer, name: str, *,
    attributes: dict[str, AttributeValue] | None = None,
    links: Sequence[Link | None] = (), context: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A current span whose failure records the error code, never the exception text.

    When ``tracer`` is the unrecorded one (``telemetry.unrecorded``; a module's proxy tracer
    is, once the process's provider is), the span is made and made current directly: the same
    ids and flags, without the three context managers the API's proxy, the tracer and
    ``use_span`` would stack for a span that records nothing."""
    if tracer is unrecorded.TRACER or (
            isinstance(tracer, trace.ProxyTracer) and unrecorded.in_use()):
        current = unrecorded.TRACER.start_span(name, context)
        token = otel_context.attach(trace.set_span_in_context(current))
        try:
            yield current
        finally:
            otel_context.detach(token)
        return
    with tracer.start_as_current_span(
        name, context=context, kind=kind, attributes=attributes,
        links=[item for item in links if item is not None],
        record_exception=False, set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, exc)
            raise


def traced(
    tracer: trace.Tracer, name: str
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Decorate a coroutine function to run inside ``span(tracer, name)``; the function sets
    its own attributes and links on ``trace.get_current_span()`` once it knows them."""

    def wrap(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            with span(tracer, name):
                return await fn(*args, **kwargs)

        return run

    return wrap


def annotate(**attributes: AttributeValue | None) -> None:
    """Set attributes on the current span by their short names (``operation_id`` →
    ``agentledger.operation_id``); ``None`` values are skipped."""
    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(_NAMES.get(key, f"agentledger.{key}"), value)


_NAMES: Final = {
    "operation_id": OPERATION_ID, "action": ACTION, "connector": CONNECTOR, "state": STATE,
    "outcome": OUTCOME, "generation": GENERATION, "stage": STAGE,
}
