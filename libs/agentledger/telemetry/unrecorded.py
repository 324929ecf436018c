"""The tracer provider of a process that exports no spans: W3C ids made, nothing recorded.

When ``telemetry.setup`` finds no span exporter (no OTLP traces endpoint, no file hook), a
recorded span would be built, bounded, timed and ended only to be dropped: the SDK's
``TracerProvider`` with no processor costs ~15 µs of CPU per span, and a command makes ten
on its happy path (issue 41). What the process still needs from its spans is
their *context*: the ``traceparent`` written into ledger rows and Kafka headers, carried to
the next service and named by the console's ``explain`` link.

So this provider's spans are ``NonRecordingSpan``\\ s with the ids and flags the SDK's
default sampler (``ParentBased(ALWAYS_ON)``) would have given them:

- a child keeps its parent's trace id, trace flags (sampled or not, random or not) and
  trace state, with a new span id: a downstream service that does export still samples
  exactly as it would have;
- a root gets a new random trace id, flagged sampled and random (``03``), as the SDK's.

Attributes, events, links and status are dropped, as the SDK drops them when nothing
processes spans. Written here because the SDK has no such mode: its ``DROP`` decision clears
the sampled flag (a downstream exporter would then drop its spans), and a disabled tracer
hands out its parent's span id, or an invalid one for a root.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.util._decorator import _agnosticcontextmanager
from opentelemetry.util.types import Attributes

# The SDK's root flags with its random id generator: sampled, and a random trace id (W3C
# Trace Context level 2).
ROOT_FLAGS: Final = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)

_ids = RandomIdGenerator()


class UnrecordedTracer(trace.Tracer):
    """Spans carrying W3C context and nothing else (module doc)."""

    def start_span(
        self, name: str, context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes = None,
        links: Sequence[Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True,
    ) -> Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            return NonRecordingSpan(SpanContext(
                parent.trace_id, _ids.generate_span_id(), is_remote=False,
                trace_flags=parent.trace_flags, trace_state=parent.trace_state))
        return NonRecordingSpan(SpanContext(
            _ids.generate_trace_id(), _ids.generate_span_id(), is_remote=False,
            trace_flags=ROOT_FLAGS))

    @_agnosticcontextmanager
    def start_as_current_span(
        self, name: str, context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes = None,
        links: Sequence[Link] | None = None, start_time: int | None = None,
        record_exception: bool = True, set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        span = self.start_span(name, context)
        with trace.use_span(span, end_on_exit=end_on_exit, record_exception=False,
                            set_status_on_exception=False) as current:
            yield current


TRACER: Final = UnrecordedTracer()


class UnrecordedTracerProvider(trace.TracerProvider):
    """Hands every instrumentation scope the one ``UnrecordedTracer``."""

    def get_tracer(
        self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
        schema_url: str | None = None, attributes: Mapping[str, object] | None = None,
    ) -> trace.Tracer:
        return TRACER


def in_use() -> bool:
    """Whether the process's global provider is this one: no span it starts is recorded.

    For a span that only measures (its context goes nowhere), the caller can then skip
    building it: its attributes and parent would be dropped anyway.
    """
    return isinstance(trace.get_tracer_provider(), UnrecordedTracerProvider)
