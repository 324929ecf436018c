"""librdkafka's log lines go through Python logging, never raw to stderr (issue 39).

A client pointed at a port nothing listens on logs ``Connect to ... failed`` from librdkafka's
own threads. Built with the library's configuration, those lines reach the
``agentledger.kafka.librdkafka`` logger and nothing reaches stderr, even when the client is
still alive at exit (what used to print after pytest's summary); built without it, they are
printed raw, which is what the first case proves absent.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("Producer", "Consumer", "AdminClient")
# The relay builds its own producer and admin client; its owners route them (issue 39's report).
NOT_YET = {"libs/agentledger/relay/publisher.py", "libs/agentledger/relay/stream.py"}

CHILD = textwrap.dedent("""
    import json, logging, sys
    import confluent_kafka
    from agentledger.kafka import batch

    seen = []
    class Keep(logging.Handler):
        def emit(self, record):
            seen.append([record.name, record.levelname, record.getMessage()])
    logging.getLogger("agentledger").addHandler(Keep())
    logging.getLogger("agentledger").setLevel(logging.INFO)
    config = batch.producer_config("127.0.0.1:9", client_id="issue-39")
    if sys.argv[1] == "raw":
        del config["logger"]
    producer = confluent_kafka.Producer(config)
    producer.produce("t", b"x")
    producer.poll(1.5)  # serves queued log lines; the producer stays alive past exit
    print(json.dumps(seen))
""")


def _run(mode: str) -> tuple[list[list[str]], str]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_without_the_logger_librdkafka_prints_raw_lines() -> None:
    _, stderr = _run("raw")
    assert "%3|" in stderr and "Connect to ipv4#127.0.0.1:9 failed" in stderr


def test_with_the_library_config_its_lines_go_to_python_logging_and_none_to_stderr() -> None:
    records, stderr = _run("logger")
    assert stderr == ""
    failures = [r for r in records if "Connect to ipv4#127.0.0.1:9 failed" in r[2]]
    assert failures and {(r[0], r[1]) for r in failures} == {
        ("agentledger.kafka.librdkafka", "ERROR")}


def _calls() -> list[tuple[str, ast.Call]]:
    found = []
    for base in ("libs", "services", "demo"):
        for path in sorted((ROOT / base).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and (getattr(node.func, "id", None) in CLIENTS
                                                   or getattr(node.func, "attr", None) in CLIENTS):
                    found.append((rel, node))
    return found


def _passes_logger(path: str, call: ast.Call) -> bool:
    if any(k.arg == "logger" for k in call.keywords):
        return True
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Call) and ast.unparse(arg.func) == "dict":
        arg = arg.args[0]  # dict(config): a config made by batch.*_config
    if isinstance(arg, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "logger" for k in arg.keys)
    if isinstance(arg, ast.Call) and ast.unparse(arg.func) in (
            "batch.producer_config", "batch.consumer_config"):
        return True  # both carry it: the child above proves producer_config does
    if isinstance(arg, ast.Name) and arg.id == "config":
        return True  # batch.connector's dict(config), a batch.consumer_config
    pytest.fail(f"{path}:{call.lineno}: cannot read the client's configuration: {ast.unparse(call)}")


def test_every_client_the_library_builds_routes_librdkafka_logs() -> None:
    calls = [(path, call) for path, call in _calls() if path not in NOT_YET]
    assert len(calls) >= 10, calls
    missing = [f"{path}:{call.lineno}" for path, call in calls if not _passes_logger(path, call)]
    assert missing == []


def test_consumer_config_carries_the_logger_too() -> None:
    from agentledger.kafka import batch, logs

    config = batch.consumer_config("x:9092", group_id="g", group_instance_id=None,
                                   session_timeout_ms=10_000, client_id="c")
    assert config["logger"] is logs.LIBRDKAFKA
