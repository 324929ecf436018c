"""The lost-record hunt (issue 19 §5): restart the broker under a running relay many times,
unattended, and check after every restart that each committed command is on its topic.

    python -m tests.lost_record --runs 500        # or: make hunt RUNS=500

One private stack (own Postgres cluster and Kafka broker on free ports, like
tests/private_stack.py) and one relay that lives through every restart, logging each
acknowledgement with its offset (``AGENTLEDGER_RELAY_TRACE_ACKS``). A run is the
broker-restart scenario of tests/integration/relay/test_relay_restarts.py: the admitter
commits ~150 commands/s for fresh tenants, the broker is stopped and started, the admitter
commits as many again, then holds while the relay drains the outbox; the run passes when
every command the database committed for the run's tenants was acknowledged to the relay and
is read back from its topic at the acknowledged offset. A failing run keeps its history under
``reports/lost-record/NAME/run-NNNN/`` (the relay's log, the broker's logs, the verdict for each
missing key from ``support.explain_misses``); every run is a line of
``reports/lost-record/NAME/runs.jsonl``; ``summary.json`` sums them up. At the end the whole of
every topic is read once more from offset 0: a record read back in an earlier run and gone
now would be a truncation, which the per-run check alone could not see.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from agentledger import settings
from tests import kafka_read, private_stack
from tests.helpers import wait_until
from tests.integration.relay import support

OUT = settings.REPO_ROOT / "reports" / "lost-record"
# Events that show the restart was felt by the relay (the fault struck).
FELT = ("event=relay.kafka_error", "event=relay.producer_reset", "event=relay.session_failed")


def _count(text: str, events: tuple[str, ...]) -> int:
    return sum(text.count(e) for e in events)


class Hunt:
    def __init__(self, stack: private_stack.PrivateStack, log_dir: Path, per_run: int,
                 out: Path) -> None:
        self.stack, self.per_run, self.out = stack, per_run, out
        tag = uuid.uuid4().hex[:8]
        self.relay = support.Relay(stack.database_url, stack.bootstrap, f"hunt_{tag}",
                                   f"hunt{tag}.", log_dir)
        self.topics = [f"{self.relay.namespace}exec.{c}.v1" for c in support.CONNECTORS]
        self.admitter = support.ResilientAdmitter(stack.database_url)
        self.ends: dict[tuple[str, int], int] = {}  # read up to here in earlier runs
        self.seen: dict[str, tuple[str, int, int]] = {}  # key -> where it was read
        self.tally: Counter[str] = Counter()

    def start(self) -> None:
        proc = self.relay.start(AGENTLEDGER_RELAY_TRACE_ACKS="true")
        assert wait_until(lambda: "event=relay.streaming" in self.relay.log_text(), timeout=60), (
            proc.poll(), self.relay.log_text()[-3000:])
        self.admitter.paused.set()
        self.admitter.start()

    def run(self, n: int) -> dict[str, Any]:
        began = time.monotonic()
        self.admitter.new_round()
        felt_before = _count(self.relay.log_text(), FELT)
        self.admitter.resume()
        floor = self.admitter.commits
        assert wait_until(lambda: self.admitter.commits >= floor + self.per_run, timeout=60)
        self.stack.run("kafka", "stop")
        self.stack.run("kafka", "start")
        floor = self.admitter.commits
        assert wait_until(lambda: self.admitter.commits >= floor + self.per_run, timeout=60)
        self.admitter.pause()
        drained = wait_until(lambda: support.outbox_count(self.stack.database_url) == 0,
                             timeout=120)
        expected = self.admitter.admitted_keys()
        records = kafka_read.read_to_end(self.stack.bootstrap, self.topics, since=self.ends)
        for r in records:
            at = (r.topic() or "", r.partition() or 0)
            self.ends[at] = max(self.ends.get(at, 0), (r.offset() or 0) + 1)
            self.seen.setdefault((r.key() or b"").decode(), (at[0], at[1], r.offset() or 0))
        log = self.relay.log_text()
        acked = support.acknowledged_at(log)
        missing = {k for k in expected if k not in self.seen}
        unacked = {k for k in expected if k not in acked}
        felt = _count(log, FELT) - felt_before
        result: dict[str, Any] = {
            "run": n, "commands": len(expected), "drained": drained, "felt": felt,
            "missing": len(missing), "unacknowledged": len(unacked),
            "seconds": round(time.monotonic() - began, 1)}
        if missing or unacked or not drained:
            kept = self.out / f"run-{n:04d}"
            kept.mkdir(parents=True, exist_ok=True)
            result["verdicts"] = support.explain_misses(self.stack.bootstrap, log, missing)
            result["unacknowledged_keys"] = sorted(unacked)[:20]
            (kept / "relay.log").write_text(log)
            shutil.copytree(self.stack.kafka_logs, kept / "broker", dirs_exist_ok=True)
            (kept / "verdict.json").write_text(json.dumps(result, indent=2) + "\n")
            # Keep going: a lost record must not hide the next one behind it.
            self.seen.update({k: ("", -1, -1) for k in missing})
        self.tally["runs"] += 1
        self.tally["commands"] += len(expected)
        self.tally["missing"] += len(missing)
        self.tally["unacknowledged"] += len(unacked)
        self.tally["undrained_runs"] += int(not drained)
        self.tally["unfelt_runs"] += int(felt == 0)
        return result

    def reread(self) -> dict[str, int]:
        """Every topic from offset 0 once more: what was read in a run must still be there."""
        now = {(r.key() or b"").decode()
               for r in kafka_read.read_to_end(self.stack.bootstrap, self.topics, timeout=600)}
        vanished = [k for k, at in self.seen.items() if at[1] >= 0 and k not in now]
        return {"records_at_end": len(now), "vanished_since_read": len(vanished)}

    def close(self) -> None:
        self.admitter.stop.set()
        self.admitter.join(timeout=30)
        for proc in self.relay.procs:
            if proc.poll() is None:
                self.relay.terminate(proc)
        self.relay.kill_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--per-run", type=int, default=200,
                        help="commands committed before and again after each restart")
    parser.add_argument("--name", default="hunt",
                        help="results go to reports/lost-record/NAME/ (hunts may run side by side)")
    args = parser.parse_args(argv)
    out = OUT / args.name
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    logs = Path(tempfile.mkdtemp(prefix="al-hunt-"))
    with private_stack.started() as stack, (out / "runs.jsonl").open("a") as runs:
        hunt = Hunt(stack, logs, args.per_run, out)
        try:
            hunt.start()
            for n in range(1, args.runs + 1):
                result = hunt.run(n)
                runs.write(json.dumps({"started": started, **result}) + "\n")
                runs.flush()
                print(f"{args.name} run {n}/{args.runs}: {result['commands']} commands, "
                      f"{result['missing']} missing, {result['unacknowledged']} unacknowledged, "
                      f"felt {result['felt']}, {result['seconds']} s", flush=True)
            end = hunt.reread()
        finally:
            hunt.close()
    summary = {"started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               **dict(hunt.tally), **end}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    shutil.rmtree(logs, ignore_errors=True)
    bad = (summary.get("missing", 0) + summary.get("unacknowledged", 0)
           + summary.get("undrained_runs", 0) + summary["vanished_since_read"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
