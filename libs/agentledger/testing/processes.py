"""Services as real processes, with readiness polled to a deadline.

Two lifetimes, one set of probes and ports:

- ``running``/``Service``: a child process that lives for a ``with`` block (tests, bench);
- ``start``/``wait_ready``/``stop_all``: a detached process in its own session that outlives
  the command which started it (the demo), logging to ``<home>/logs/<name>.log`` and leaving
  ``<home>/pids/<name>.pid``. ``stop_all`` signals exactly the pids recorded there, and only
  if the process behind a pid still runs what was started (never a pattern match).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg2  # type: ignore[import-untyped]
from confluent_kafka.admin import AdminClient

from agentledger import settings
from agentledger.kafka import logs
from agentledger.testing.polling import wait_until

# A service imports FastStream/FastAPI, opens a pool and joins a consumer group: ~5-15 s on
# a loaded 2-core box. Two minutes means "broken", not "slow".
READY_TIMEOUT_S = 120.0
# SIGTERM lets executors release their claims (drain) and the relay flush; after this, SIGKILL.
STOP_TIMEOUT_S = 20.0
# How often readiness is asked: probes answer in milliseconds, start-up takes seconds.
POLL_S = 0.3


class StartFailed(Exception):
    """A process did not become ready; ``fix`` is what to try."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if nothing listens there, else any free port on 127.0.0.1."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise StartFailed("no free TCP port on 127.0.0.1")  # pragma: no cover - bind(0) succeeds


def free_ports(preferred: Mapping[str, int | None]) -> dict[str, int]:
    """A distinct free port per name (its preferred one when nothing listens there): ports
    probed one by one may repeat, since each probe's socket is closed before the next."""
    ports: dict[str, int] = {}
    for name, want in preferred.items():
        port = free_port(want)
        while port in ports.values():
            port = free_port()
        ports[name] = port
    return ports


def _tail(log: Path, lines: int) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


# --- child processes -------------------------------------------------------------------------


def terminate(proc: subprocess.Popen[bytes], grace: float = STOP_TIMEOUT_S) -> None:
    """Stop a child we started: SIGTERM (a graceful shutdown), SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# What every service this kit starts runs on unless its env says otherwise: the packaged
# (demo) allowlist, policies and connectors — tests, the bench and the demo are the demo's
# deployment. Outside it a service refuses to start without its operator's configuration
# (settings.require_configuration).
PROFILE: dict[str, str] = {"AGENTLEDGER_PROFILE": settings.DEMO_PROFILE}


class Service:
    """A running child process; its output goes to ``log``."""

    def __init__(self, module: str, env: Mapping[str, str], log: Path,
                 prefix: Sequence[str] = ()) -> None:
        # ``prefix``: what the command runs under, e.g. ``ip netns exec NAME`` (tests/netns.py).
        self.module, self.env, self.log, self.prefix = module, dict(env), log, list(prefix)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [*self.prefix, sys.executable, "-m", self.module],
                env={**os.environ, **PROFILE, **self.env},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)

    def tail(self, n: int = 40) -> str:
        return _tail(self.log, n)


@contextmanager
def running(
    module: str, env: Mapping[str, str], log: Path, *, ready: Callable[[], bool],
    timeout: float = 60.0, prefix: Sequence[str] = (),
) -> Iterator[Service]:
    """Start ``python -m module`` (under ``prefix``), wait until ``ready()`` holds, stop it at
    the end; raises AssertionError with its log if it exits or is not ready in time."""
    service = Service(module, env, log, prefix)
    service.start()
    try:
        ok = wait_until(lambda: not service.alive() or ready(), timeout=timeout)
        if not ok or not service.alive():
            raise AssertionError(f"{module} did not become ready:\n{service.tail()}")
        yield service
    finally:
        service.stop()


# --- detached processes with pid files -------------------------------------------------------


@dataclass(frozen=True)
class Detached:
    """One started detached process; ``marker`` is an argument by which it is recognised."""

    name: str
    marker: str
    pid: int
    log: Path

    def alive(self) -> bool:
        return _is_ours(self.pid, self.marker)

    def tail(self, lines: int = 15) -> str:
        return _tail(self.log, lines)


def _is_ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` still runs a command with ``marker`` among its arguments (not a
    recycled pid, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return marker.encode() in cmdline and state != "Z"


def start(home: Path, name: str, module: str, env: Mapping[str, str]) -> Detached:
    """Start ``python -m module`` detached, logging to ``home/logs/name.log``, pid file written."""
    return start_command(home, name, [sys.executable, "-m", module], module,
                         {**PROFILE, **env, "PYTHONUNBUFFERED": "1"})


def start_command(home: Path, name: str, argv: Sequence[str], marker: str,
                  env: Mapping[str, str] | None = None) -> Detached:
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
    return Detached(name, marker, proc.pid, log)


def wait_ready(services: Iterable[Detached], probes: Mapping[str, Callable[[], bool]],
               *, timeout: float = READY_TIMEOUT_S,
               on_ready: Callable[[str], None] | None = None) -> None:
    """Poll every probe until all pass; fail at once with its log if a process exits."""
    waiting = {s.name: s for s in services}
    deadline = time.monotonic() + timeout
    while waiting:
        for name, service in list(waiting.items()):
            if not service.alive():
                raise StartFailed(f"{name} exited during start-up:\n{service.tail()}",
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
            raise StartFailed(f"not ready after {timeout:.0f} s: {names}",
                              f"read the logs in {next(iter(waiting.values())).log.parent}")
        if waiting:
            time.sleep(POLL_S)  # a poll interval, not a wait for a condition


def _read_pid_file(pid_file: Path) -> tuple[str, str]:
    """(pid, marker): the marker is the rest of the line (a binary's path may hold spaces)."""
    pid_text, _, marker = pid_file.read_text().strip().partition(" ")
    if not marker:
        raise ValueError(f"{pid_file}: no marker")
    return pid_text, marker


def recorded(home: Path) -> list[tuple[str, int, bool]]:
    """(name, pid, alive) of every process with a pid file under ``home``."""
    found = []
    for pid_file in sorted((home / "pids").glob("*.pid")):
        try:
            pid_text, marker = _read_pid_file(pid_file)
            pid = int(pid_text)
        except ValueError:
            continue
        found.append((pid_file.stem, pid, _is_ours(pid, marker)))
    return found


def stop_all(home: Path, timeout: float = STOP_TIMEOUT_S) -> list[str]:
    """SIGTERM each recorded process that is still ours, SIGKILL after ``timeout``.

    Returns:
        The names of the processes that were running.
    """
    targets: list[tuple[Path, str, int, str]] = []
    for pid_file in sorted((home / "pids").glob("*.pid")):
        try:
            pid_text, marker = _read_pid_file(pid_file)
            targets.append((pid_file, pid_file.stem, int(pid_text), marker))
        except ValueError:
            pid_file.unlink(missing_ok=True)
    stopped = []
    for _, name, pid, marker in targets:
        if _is_ours(pid, marker):
            os.kill(pid, signal.SIGTERM)
            stopped.append(name)
    deadline = time.monotonic() + timeout
    for pid_file, _, pid, marker in targets:
        # Another session's process: no wait() on a non-child, so its /proc entry is polled.
        wait_until(lambda: not _is_ours(pid, marker),  # noqa: B023 - used within the loop
                   timeout=max(0.0, deadline - time.monotonic()), interval=0.1)
        if _is_ours(pid, marker):
            os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)
    return stopped


# --- readiness probes ------------------------------------------------------------------------


def http_ok(url: str) -> Callable[[], bool]:
    """Ready when ``url`` answers 200."""
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return probe


def group_has_members(bootstrap: str, group_id: str) -> Callable[[], bool]:
    """Ready when the consumer group is stable with a member (it holds partitions)."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=logs.LIBRDKAFKA)

    def probe() -> bool:
        try:
            desc = admin.describe_consumer_groups([group_id])[group_id].result(timeout=5)
        except Exception:
            return False
        return bool(desc.members) and str(desc.state).endswith("STABLE")
    return probe


def slot_active(database_url: str, slot: str) -> Callable[[], bool]:
    """Ready when the replication slot ``slot`` has a consumer (the relay streams)."""
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
    """Ready when ``path`` holds ``marker``."""
    def probe() -> bool:
        return path.exists() and marker in path.read_text(errors="replace")
    return probe
