"""``telemetry.unrecorded``: spans that carry the SDK's W3C context and record nothing."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, TraceFlags, TraceState

from agentledger.telemetry import spans
from agentledger.telemetry.unrecorded import UnrecordedTracerProvider

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
RANDOM_SAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"

ours = UnrecordedTracerProvider().get_tracer("probe")
sdk = TracerProvider().get_tracer("probe")  # the SDK's default sampler, no processor


def test_a_root_gets_fresh_ids_flagged_as_the_sdk_flags_them() -> None:
    first, second = ours.start_span("a", context=spans.ROOT), ours.start_span("b", context=spans.ROOT)
    reference = sdk.start_span("a", context=spans.ROOT).get_span_context()
    for span in (first, second):
        ctx = span.get_span_context()
        assert ctx.is_valid and not ctx.is_remote and not span.is_recording()
        assert ctx.trace_flags == reference.trace_flags == TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID
    assert first.get_span_context().trace_id != second.get_span_context().trace_id
    assert spans.traceparent_of(first) == (
        f"00-{first.get_span_context().trace_id:032x}-{first.get_span_context().span_id:016x}-03")


@pytest.mark.parametrize("traceparent", [SAMPLED, UNSAMPLED, RANDOM_SAMPLED])
def test_a_child_keeps_what_the_sdk_keeps_of_its_parent_with_a_new_span_id(traceparent: str) -> None:
    parent = spans.context_from(traceparent, "vendor=1,agentledger=abc-def")
    assert parent is not None
    remote = trace.get_current_span(parent).get_span_context()
    child = ours.start_span("child", context=parent, kind=SpanKind.PRODUCER,
                            attributes={"a": "b"}).get_span_context()
    reference = sdk.start_span("child", context=parent).get_span_context()
    assert (child.trace_id, child.trace_flags, child.trace_state) == (
        reference.trace_id, reference.trace_flags, reference.trace_state)
    assert child.trace_id == remote.trace_id and child.span_id != remote.span_id
    assert child.trace_state == TraceState([("vendor", "1"), ("agentledger", "abc-def")])


def test_current_spans_nest_and_are_restored() -> None:
    before = trace.get_current_span()
    with spans.span(ours, "outer") as outer:
        assert trace.get_current_span() is outer
        with ours.start_as_current_span("inner") as inner:
            assert trace.get_current_span() is inner
            assert inner.get_span_context().trace_id == outer.get_span_context().trace_id
            assert inner.get_span_context().span_id != outer.get_span_context().span_id
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is before


def test_a_failure_inside_a_span_propagates_and_leaves_nothing_current() -> None:
    before = trace.get_current_span()
    with pytest.raises(ValueError, match="boom"), spans.span(ours, "failing"):
        raise ValueError("boom")
    assert trace.get_current_span() is before


def test_links_attributes_and_status_are_accepted_and_dropped() -> None:
    link = spans.link(SAMPLED, "retry_of")
    with spans.span(ours, "linked", links=[link], attributes={spans.OPERATION_ID: "op"}) as span:
        span.set_attribute(spans.STATE, "succeeded")
        spans.annotate(outcome="ok")
        spans.add_link(span, SAMPLED, "origin")
        assert not span.is_recording()


def test_the_relay_builds_no_publish_span_when_nothing_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``relay.publish`` only measures (records carry admission's context): with the
    unrecorded provider it is not built; with the SDK's it is, as a child of the record's."""
    from agentledger.relay import publisher, routing
    from agentledger.telemetry import unrecorded

    record = routing.Record(table="event_outbox", topic="t", key=b"k", value=b"{}", event_id="e",
                            headers=(("traceparent", SAMPLED.encode()),), family="exec",
                            operation_id="op")
    monkeypatch.setattr(trace, "get_tracer_provider", UnrecordedTracerProvider)
    assert unrecorded.in_use()
    assert publisher._publish_span(record) is trace.INVALID_SPAN
    sdk_provider = TracerProvider()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: sdk_provider)
    monkeypatch.setattr(publisher, "tracer", sdk_provider.get_tracer("agentledger.relay"))
    assert not unrecorded.in_use()
    span = publisher._publish_span(record)
    assert span.is_recording()
    assert span.get_span_context().trace_id == int(SAMPLED.split("-")[1], 16)
    span.end()


def test_span_makes_the_unrecorded_span_current_directly_with_the_same_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the unrecorded provider in use, ``spans.span`` skips the API's context managers:
    the span it yields is current inside, a child of the given (or current) context as the
    tracer makes it, and what was current before is current again after, failure or not."""
    from agentledger.telemetry import unrecorded

    proxy = trace.get_tracer("probe")  # what a module gets at import, before setup
    monkeypatch.setattr(trace, "get_tracer_provider", UnrecordedTracerProvider)
    assert unrecorded.in_use()
    before = trace.get_current_span()
    parent = spans.context_from(UNSAMPLED, "vendor=1")
    assert parent is not None
    with spans.span(proxy, "outer", context=parent, attributes={"a": "b"}) as outer:
        assert trace.get_current_span() is outer and not outer.is_recording()
        got = outer.get_span_context()
        reference = ours.start_span("outer", context=parent).get_span_context()
        assert (got.trace_id, got.trace_flags, got.trace_state) == (
            reference.trace_id, reference.trace_flags, reference.trace_state)
        with spans.span(proxy, "inner") as inner:
            assert trace.get_current_span() is inner
            assert inner.get_span_context().trace_id == got.trace_id
            assert inner.get_span_context().span_id != got.span_id
        assert trace.get_current_span() is outer
        with pytest.raises(ValueError, match="boom"), spans.span(proxy, "failing", context=spans.ROOT) as root:
            assert root.get_span_context().trace_id != got.trace_id
            assert root.get_span_context().trace_flags == unrecorded.ROOT_FLAGS
            raise ValueError("boom")
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is before
    # A tracer of another provider is that provider's, whatever the process's is.
    with spans.span(sdk, "own") as own:
        assert own.is_recording()
    assert not own.is_recording()  # ended on exit, as the SDK's tracer ends it
