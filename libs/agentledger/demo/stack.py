"""The demo's processes: the shared stack, a fresh database and namespace, services with pid files.

Every service runs as ``python -m agentledger.services.<name>`` in its own session (so it
outlives the ``agentledger demo`` command), logs to ``<home>/logs/<name>.log`` and leaves
``<home>/pids/<name>.pid``. ``stop_all`` signals exactly the pids recorded there, and only
if the process behind a pid is still the module that was started.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg2  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from agentledger import settings

HOME = settings.REPO_ROOT / ".local" / "demo"
STACK_SCRIPT = settings.REPO_ROOT / "deploy" / "local" / "stack.sh"
ENV_FILE = settings.REPO_ROOT / ".local" / "env"
# A service imports FastStream/FastAPI, opens a pool and joins a consumer group: ~5-15 s on
# a loaded 2-core box. Two minutes means "broken", not "slow".
READY_TIMEOUT_S = 120.0
# SIGTERM lets executors release their claims (drain) and the relay flush; after this, SIGKILL.
STOP_TIMEOUT_S = 20.0
# Probes of a stack that is up answer in milliseconds; a down one must not hang the check.
PROBE_TIMEOUT_S = 3.0


class DemoError(Exception):
    """A step of the demo failed; ``fix`` is what to try."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


# --- the shared stack ------------------------------------------------------------------------


def load_env_file(path: Path = ENV_FILE) -> None:
    """Fill AGENTLEDGER_* variables from ``.local/env`` where the environment has none."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        found = re.match(r"^\s*(?:export\s+)?(AGENTLEDGER_[A-Z_]+)=(.*)$", line)
        if found and found[1] not in os.environ:
            os.environ[found[1]] = found[2].strip().strip("'\"")


def postgres_answers(url: str) -> bool:
    try:
        psycopg2.connect(url, connect_timeout=int(PROBE_TIMEOUT_S)).close()
    except psycopg2.Error:
        return False
    return True


def kafka_answers(bootstrap: str) -> bool:
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=PROBE_TIMEOUT_S)
    except Exception:
        return False
    return True


def ensure_stack(database_url: str, bootstrap: str) -> bool:
    """Start Kafka and PostgreSQL with ``deploy/local/stack.sh up`` unless both answer.

    Returns:
        Whether the stack had to be started.
    """
    if postgres_answers(database_url) and kafka_answers(bootstrap):
        return False
    log = HOME / "logs" / "stack-up.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        rc = subprocess.call(["bash", str(STACK_SCRIPT), "up"],  # noqa: S603,S607 - our script
                             stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise DemoError(f"deploy/local/stack.sh up failed (exit {rc}); its output is in {log}",
                        "run `make bootstrap` once (installs Java, Maven, PostgreSQL), then "
                        "`make up` to see the error")
    load_env_file()
    return True


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def recreate_database(owner_url: str, name: str) -> str:
    """Drop ``name`` (and the replication slots on it) and create it empty; returns its URL."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise DemoError(f"database name {name!r} is not a plain lower-case identifier",
                        "use letters, digits and _ only")
    conn = psycopg2.connect(owner_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,))
            for (slot,) in cur.fetchall():
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return with_database(owner_url, name)


def delete_topics(bootstrap: str, prefix: str) -> int:
    """Delete the topics of earlier demo runs (everything under ``prefix``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    for future in (admin.delete_topics(names, operation_timeout=30).values() if names else []):
        future.result(timeout=30)
    return len(names)


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if nothing listens there, else any free port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise DemoError("no free TCP port on 127.0.0.1")  # pragma: no cover - bind(0) succeeds


# --- service processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """One started service process."""

    name: str
    module: str
    pid: int
    log: Path

    def alive(self) -> bool:
        return _is_ours(self.pid, self.module)

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _is_ours(pid: int, module: str) -> bool:
    """Whether ``pid`` still runs ``python -m module`` (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return module.encode() in cmdline and state != "Z"


def start(home: Path, name: str, module: str, env: Mapping[str, str]) -> Service:
    """Start ``python -m module`` detached, logging to ``home/logs/name.log``, pid file written."""
    return start_command(home, name, [sys.executable, "-m", module], module,
                         {**env, "PYTHONUNBUFFERED": "1"})


def start_command(home: Path, name: str, argv: Sequence[str], marker: str,
                  env: Mapping[str, str] | None = None) -> Service:
    """Start ``argv`` detached (a service, or a program such as Mailpit), logging to
    ``home/logs/name.log``; the pid file names ``marker``, an argument of ``argv`` by which
    ``stop_all`` recognises the process as still ours."""
    (home / "logs").mkdir(parents=True, exist_ok=True)
    (home / "pids").mkdir(parents=True, exist_ok=True)
    log = home / "logs" / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter, module or built binary
            list(argv), env={**os.environ, **(env or {})},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=settings.REPO_ROOT)
    (home / "pids" / f"{name}.pid").write_text(f"{proc.pid} {marker}\n")
    return Service(name, marker, proc.pid, log)


def wait_ready(services: Iterable[Service], probes: Mapping[str, Callable[[], bool]],
               *, timeout: float = READY_TIMEOUT_S,
               on_ready: Callable[[str], None] | None = None) -> None:
    """Poll every probe until all pass; fail at once with its log if a service exits."""
    waiting = {s.name: s for s in services}
    deadline = time.monotonic() + timeout
    while waiting:
        for name, service in list(waiting.items()):
            if not service.alive():
                raise DemoError(f"{name} exited during start-up:\n{service.tail()}",
                                f"read {service.log}")
            try:
                ready = probes[name]()
            except Exception:
                ready = False
            if ready:
                del waiting[name]
                if on_ready:
                    on_ready(name)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(sorted(waiting))
            raise DemoError(f"not ready after {timeout:.0f} s: {names}",
                            f"read the logs in {next(iter(waiting.values())).log.parent}")
        if waiting:
            time.sleep(0.3)  # a poll interval, not a wait for a condition


def _read_pid_file(pid_file: Path) -> tuple[str, str]:
    """(pid, marker): the marker is the rest of the line (a binary's path may hold spaces)."""
    pid_text, _, marker = pid_file.read_text().strip().partition(" ")
    if not marker:
        raise ValueError(f"{pid_file}: no marker")
    return pid_text, marker


def running(home: Path = HOME) -> list[tuple[str, int, bool]]:
    """(name, pid, alive) of every service with a pid file under ``home``."""
    found = []
    for pid_file in sorted((home / "pids").glob("*.pid")):
        try:
            pid_text, module = _read_pid_file(pid_file)
            pid = int(pid_text)
        except ValueError:
            continue
        found.append((pid_file.stem, pid, _is_ours(pid, module)))
    return found


def stop_all(home: Path = HOME, timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """SIGTERM each recorded service that is still ours, SIGKILL after ``timeout``.

    Returns:
        The names of the services that were running.
    """
    targets: list[tuple[Path, str, int, str]] = []
    for pid_file in sorted((home / "pids").glob("*.pid")):
        try:
            pid_text, module = _read_pid_file(pid_file)
            targets.append((pid_file, pid_file.stem, int(pid_text), module))
        except ValueError:
            pid_file.unlink(missing_ok=True)
    stopped = []
    for _, name, pid, module in targets:
        if _is_ours(pid, module):
            os.kill(pid, signal.SIGTERM)
            stopped.append(name)
    deadline = time.monotonic() + timeout
    for pid_file, _, pid, module in targets:
        while _is_ours(pid, module) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling another session's process: no wait() on a non-child
        if _is_ours(pid, module):
            os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    return stopped


# --- readiness probes ------------------------------------------------------------------------


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return probe


def group_has_members(bootstrap: str, group_id: str) -> Callable[[], bool]:
    """Ready when the consumer group is stable with a member (it holds partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def probe() -> bool:
        desc = admin.describe_consumer_groups([group_id])[group_id].result(timeout=5)
        return bool(desc.members) and str(desc.state).endswith("STABLE")
    return probe


def slot_active(database_url: str, slot: str) -> Callable[[], bool]:
    def probe() -> bool:
        conn = psycopg2.connect(database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                            (slot,))
                row = cur.fetchone()
        finally:
            conn.close()
        return bool(row and row[0])
    return probe


def log_contains(path: Path, marker: str) -> Callable[[], bool]:
    def probe() -> bool:
        return path.exists() and marker in path.read_text(errors="replace")
    return probe
