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
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from agentledger import settings
from agentledger.testing import kafka_read
from agentledger.testing import ledger as testing_ledger
from agentledger.testing.polling import wait_until
from tests import private_stack
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
        self.topics = [f"{self.relay.namespace}exec.{c}.v1" for c in testing_ledger.CONNECTORS]
        # ~45 commands/s: records in flight at every moment of a restart, at a third of the
        # CPU of the relay tests' rate (the hunt's figure is restarts, not records).
        self.admitter = support.ResilientAdmitter(stack.database_url, pace_s=0.02)
        self.log_at = 0  # the relay's log is read on from here: it grows by a line per record
        self.acked: set[str] = set()
        self.felt = 0
        self.offsetless = 0  # acknowledgements without an offset (a duplicate, per the broker)
        self.ends: dict[tuple[str, int], int] = {}  # read up to here in earlier runs
        self.seen: dict[str, tuple[str, int, int]] = {}  # key -> where it was read
        self.tally: Counter[str] = Counter()

    def start(self) -> None:
        proc = self.relay.start(AGENTLEDGER_RELAY_TRACE_ACKS="true")
        assert wait_until(lambda: "event=relay.streaming" in self.relay.log_text(), timeout=60), (
            proc.poll(), self.relay.log_text()[-3000:])
        self.admitter.paused.set()
        self.admitter.start()

    def _read_log(self) -> str:
        """The relay's log lines written since the last call (complete lines only)."""
        path = self.relay.log_dir / "relay-0.log"
        with path.open("rb") as f:
            f.seek(self.log_at)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.log_at += len(complete)
        text = complete.decode(errors="replace")
        self.acked.update(support.acknowledged_at(text))
        self.felt += _count(text, FELT)
        self.offsetless += sum(1 for line in text.splitlines()
                               if "event=relay.acked " in line and "offset=None" in line)
        return text

    def run(self, n: int) -> dict[str, Any]:
        began = time.monotonic()
        self.admitter.new_round()
        self._read_log()
        felt_before, offsetless_before = self.felt, self.offsetless
        self.admitter.resume()
        floor = self.admitter.commits
        assert wait_until(lambda: self.admitter.commits >= floor + self.per_run, timeout=60)
        self.stack.run("kafka", "stop")
        self.stack.run("kafka", "start")
        floor = self.admitter.commits
        assert wait_until(lambda: self.admitter.commits >= floor + self.per_run, timeout=60)
        self.admitter.pause()
        drained = wait_until(lambda: testing_ledger.outbox_count(self.stack.database_url) == 0,
                             timeout=120)
        expected = self.admitter.admitted_keys()
        records = kafka_read.read_to_end(self.stack.bootstrap, self.topics, since=self.ends)
        for r in records:
            at = (r.topic() or "", r.partition() or 0)
            self.ends[at] = max(self.ends.get(at, 0), (r.offset() or 0) + 1)
            self.seen.setdefault((r.key() or b"").decode(), (at[0], at[1], r.offset() or 0))
        self._read_log()
        missing = {k for k in expected if k not in self.seen}
        unacked = {k for k in expected if k not in self.acked}
        felt = self.felt - felt_before
        result: dict[str, Any] = {
            "run": n, "commands": len(expected), "drained": drained, "felt": felt,
            "missing": len(missing), "unacknowledged": len(unacked),
            "offsetless_acks": self.offsetless - offsetless_before,
            "seconds": round(time.monotonic() - began, 1)}
        if missing or unacked or not drained:
            kept = self.out / f"run-{n:04d}"
            kept.mkdir(parents=True, exist_ok=True)
            log = self.relay.log_text()
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


def _all_sessions(path: Path) -> dict[str, int]:
    """Every run ever recorded under this name (a hunt may be resumed in a new session)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {"sessions": len({r["started"] for r in lines}), "runs": len(lines),
            "commands": sum(r["commands"] for r in lines),
            "missing": sum(r["missing"] for r in lines),
            "unacknowledged": sum(r["unacknowledged"] for r in lines),
            "undrained_runs": sum(not r["drained"] for r in lines),
            "unfelt_runs": sum(r["felt"] == 0 for r in lines),
            "offsetless_acks": sum(r.get("offsetless_acks", 0) for r in lines)}


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every cleanup below


def main(argv: list[str] | None = None) -> int:
    # A hunt started in the background ignores SIGINT (the shell's rule for `&` jobs): stop
    # it with SIGTERM, which here unwinds like Ctrl-C and stops the private stack.
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--per-run", type=int, default=200,
                        help="commands committed before and again after each restart")
    parser.add_argument("--name", default="hunt",
                        help="results go to reports/lost-record/NAME/ (hunts may run side by side)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop after the run under way when this much time has passed")
    args = parser.parse_args(argv)
    deadline = None if args.minutes is None else time.monotonic() + 60 * args.minutes
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
                if deadline is not None and time.monotonic() > deadline:
                    break
            end = hunt.reread()
        finally:
            hunt.close()
    summary = {"started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               **dict(hunt.tally), **end, "all_sessions": _all_sessions(out / "runs.jsonl")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    shutil.rmtree(logs, ignore_errors=True)
    bad = (summary.get("missing", 0) + summary.get("unacknowledged", 0)
           + summary.get("undrained_runs", 0) + summary["vanished_since_read"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
