"""Pure arithmetic of the benchmark: percentiles, steady-state rates, ratios. No I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence

# Completions between the 10th and 90th percentile of finish times: the pipeline is full
# and not yet draining there, so start-up and the tail of the burst do not dilute the rate.
STEADY_LO = 0.10
STEADY_HI = 0.90


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def steady_rate(finished_at: Sequence[float], lo: float = STEADY_LO,
                hi: float = STEADY_HI) -> float | None:
    """Events per second between the ``lo`` and ``hi`` quantiles of the finish times.

    None when there are too few events (under 10) or they all finished at the same instant.
    """
    if len(finished_at) < 10:
        return None
    ordered = sorted(finished_at)
    last = len(ordered) - 1
    i, j = math.floor(lo * last), math.ceil(hi * last)
    span = ordered[j] - ordered[i]
    if span <= 0:
        return None
    return (j - i) / span


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` rounded to 3 places, or None when either is missing."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 3)


def latencies_ms(started: dict[str, float], finished: dict[str, float]) -> list[float]:
    """Per-key latency in ms for the keys that finished (seconds since the epoch in, ms out)."""
    return [(finished[k] - t0) * 1000.0 for k, t0 in started.items() if k in finished]


def rounded(value: float | None, places: int = 1) -> float | None:
    return None if value is None else round(value, places)
