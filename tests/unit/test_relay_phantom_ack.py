"""A success report is trusted only if it has an offset that moves its partition forward."""

from __future__ import annotations

from agentledger.relay.publisher import phantom_ack


def test_offsets_that_grow_are_trusted_per_partition() -> None:
    acked: dict[tuple[str, int], int] = {}
    assert phantom_ack(acked, "t", 0, 10) is None
    assert phantom_ack(acked, "t", 0, 11) is None
    assert phantom_ack(acked, "t", 1, 3) is None  # another partition starts on its own
    assert phantom_ack(acked, "u", 0, 0) is None  # and so does another topic
    assert acked == {("t", 0): 11, ("t", 1): 3, ("u", 0): 0}


def test_an_offset_already_acknowledged_is_a_phantom() -> None:
    # The broker's answer to a batch it mistook for a retry: the old batch's offsets.
    acked = {("t", 0): 40}
    reason = phantom_ack(acked, "t", 0, 37)
    assert reason is not None and "37" in reason and "40" in reason
    assert phantom_ack(acked, "t", 0, 40) is not None
    assert acked == {("t", 0): 40}  # a phantom never moves the mark


def test_reports_without_an_offset_are_not_trusted() -> None:
    # librdkafka's "already written" (an idempotent duplicate): seen for a record that was
    # never written (the first of a new partition), so it is refused, never swept on.
    acked = {("t", 0): 5}
    for offset in (-1001, -1, None):  # OFFSET_INVALID, OFFSET_END, none at all
        reason = phantom_ack(acked, "t", 0, offset)
        assert reason is not None and "without an offset" in reason
    assert phantom_ack(acked, None, None, None) is not None
    assert phantom_ack({}, "t", 0, None) is not None  # even as a partition's first report
    assert acked == {("t", 0): 5}  # a refused report never moves the mark
