"""Issue 41's bars, and whether a run's figures meet them. Pure: no I/O.

A benchmark, not a test: the verdicts are printed in ``latest.md``, and nothing in
``tests/`` asserts a figure. Absolute CPU moves with the box; the issue gates on the ratios
to the peer of the same run, and asks the absolute figures to meet their bars on an idle box
(so the load average before and after is printed beside them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bar:
    figure: str  # key in latest.json's figures; "" when the bench does not measure it
    what: str
    at_most: bool  # True: the figure must be <= the bar; False: >=
    bar: float
    goal: float | None = None
    elsewhere: str = ""  # where the figure is measured when not by `make bench`


BARS: tuple[Bar, ...] = (
    Bar("box_cpu_ms_per_cmd", "whole-box CPU-ms per command, burst", True, 3.1, 2.5),
    Bar("box_cpu_ratio_peer_to_ours", "peer whole-box CPU per command ÷ ours, same run",
        False, 4.0, 5.0),
    Bar("ours_to_peer_cmds_per_s", "e2e commands/s ÷ DBOS peer, same run", False, 3.0, 5.0),
    Bar("services_cpu_ms_per_cmd", "our services CPU-ms per command", True, 1.2),
    Bar("ledger_pg_cpu_ms_per_cmd", "ledger Postgres CPU-ms per command", True, 1.1),
    Bar("kafka_cpu_ms_per_cmd", "broker CPU-ms per command", True, 0.25),
    Bar("ledger_statements_per_cmd", "statements per command on the ledger (happy path)",
        True, 3.0),
    Bar("e2e_ms_p99", "e2e p99 at half load, ms", True, 100.0),
    Bar("relay_lag_ms_p99", "relay commit→ack p99 at 200/s, ms", True, 20.0),
    Bar("relay_rate_achieved_1000", "relay at 1,000/s offered: achieved /s", False, 900.0),
    Bar("", "soak at ≥ 50 % capacity, 30 min, with faults: invariants broken", True, 0.0,
        elsewhere="`make soak` → docs/evidence/soak-load.json"),
)


# On an idle box the processes under test are nearly all of its CPU (the rest: kernel
# threads, other stacks' idle brokers and databases, a few per cent). Past this share of
# the box taken by other processes during a burst, someone else's work is inside the
# whole-box figures, and their verdicts are marked inconclusive.
BUSY_SHARE = 0.10
# The bars whose figure is the whole box itself (others' CPU is in it, not just beside it).
BOX_FIGURES = frozenset({"box_cpu_ms_per_cmd", "box_cpu_ratio_peer_to_ours"})
# Counts, not times: the same on a busy box.
COUNT_FIGURES = frozenset({"ledger_statements_per_cmd"})


def others_share(figures: Mapping[str, Any]) -> dict[str, float]:
    """Per side, the share of the box's CPU in the burst taken by other processes."""
    out: dict[str, float] = {}
    for side, prefix in (("ours", ""), ("peer", "peer_")):
        box, other = figures.get(f"{prefix}box_cpu_ms_per_cmd"), figures.get(
            f"{prefix}box_other_cpu_ms_per_cmd")
        if isinstance(box, int | float) and isinstance(other, int | float) and box > 0:
            out[side] = round(max(0.0, other) / box, 3)
    return out


def meets(value: float, limit: float, at_most: bool) -> bool:
    return value <= limit if at_most else value >= limit


def evaluate(figures: Mapping[str, Any], bars: tuple[Bar, ...] = BARS) -> list[dict[str, Any]]:
    """One row per bar: the value, ``pass``/``fail``/``not measured``, and whether the goal
    (when there is one) is met too."""
    rows: list[dict[str, Any]] = []
    busy = {side: share for side, share in others_share(figures).items() if share > BUSY_SHARE}
    for b in bars:
        value = figures.get(b.figure) if b.figure else None
        if not isinstance(value, int | float) or isinstance(value, bool):
            status, goal = "not measured", None
        else:
            status = "pass" if meets(float(value), b.bar, b.at_most) else "fail"
            goal = None if b.goal is None else meets(float(value), b.goal, b.at_most)
        note = ""
        if busy and status != "not measured" and b.figure not in COUNT_FIGURES:
            sides = ", ".join(f"{round(100 * v)} % of the box in "
                              f"{'our' if k == 'ours' else 'the peer' + chr(39) + 's'} burst"
                              for k, v in busy.items())
            note = (f"inconclusive: other processes took {sides}" if b.figure in BOX_FIGURES
                    else "box busy (not the idle box the bar is for)")
        rows.append({"figure": b.figure, "what": b.what, "bar": b.bar, "goal": b.goal,
                     "at_most": b.at_most, "value": value, "status": status,
                     "goal_met": goal, "elsewhere": b.elsewhere, "note": note})
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The bars as a Markdown table."""
    def limit(r: dict[str, Any], x: float | None) -> str:
        return "—" if x is None else f"{'≤' if r['at_most'] else '≥'} {x:g}"

    lines = ["| figure | bar | goal | this run | verdict |", "| --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        value = r["value"]
        shown = "—" if value is None else (f"{value:,.3f}" if isinstance(value, float)
                                           else str(value))
        verdict = r["status"]
        if r["goal_met"] is not None:
            verdict += ", goal met" if r["goal_met"] else ", goal not met"
        if r["elsewhere"]:
            verdict += f" (by {r['elsewhere']})"
        if r.get("note"):
            verdict += f" — {r['note']}"
        name = f"`{r['figure']}`" if r["figure"] else ""
        lines.append(f"| {r['what']} {name} | {limit(r, r['bar'])} | {limit(r, r['goal'])} "
                     f"| {shown} | {verdict} |")
    return lines
