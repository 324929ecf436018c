"""The backoff of a requeue after nothing was sent: exponential, capped, jittered."""

from __future__ import annotations

import random

from agentledger.ledger import dispatch


def test_the_backoff_doubles_per_generation_within_its_jitter_and_stops_at_the_cap() -> None:
    rng = random.Random(7)
    for generation, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (5, 32.0), (6, 60.0), (9, 60.0)]:
        waits = [dispatch.backoff(generation, rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (generation, min(waits),
                                                                  max(waits))
        assert max(waits) - min(waits) > ceiling / 4  # really jittered, not one instant


def test_ten_generations_ride_out_minutes_of_outage_before_an_operator() -> None:
    lowest = sum(dispatch.backoff(g, rng=random.Random(0)) for g in range(1, dispatch.MAX_GENERATIONS))
    assert lowest > 120  # at least two minutes of an unreachable provider before `unknown`
