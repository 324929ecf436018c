"""Run agentledger services as real subprocesses in tests, with readiness polled to a deadline."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """A running service process; its output goes to ``log``."""

    def __init__(self, module: str, env: Mapping[str, str], log: Path,
                 prefix: Sequence[str] = ()) -> None:
        # ``prefix``: what the command runs under, e.g. ``ip netns exec NAME`` (tests/netns.py).
        self.module, self.env, self.log, self.prefix = module, dict(env), log, list(prefix)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [*self.prefix, sys.executable, "-m", self.module], env={**os.environ, **self.env},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        out.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@contextmanager
def running(
    module: str, env: Mapping[str, str], log: Path, *, ready: Callable[[], bool],
    timeout: float = 60.0, prefix: Sequence[str] = (),
) -> Iterator[Service]:
    """Start ``python -m module`` (under ``prefix``) and wait until ``ready()`` holds (or
    fail with its log)."""
    service = Service(module, env, log, prefix)
    service.start()
    try:
        ok = wait_until(lambda: not service.alive() or ready(), timeout=timeout)
        if not ok or not service.alive():
            raise AssertionError(f"{module} did not become ready:\n{service.tail()}")
        yield service
    finally:
        service.stop()


def http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return probe


def group_has_members(bootstrap: str, group_id: str) -> Callable[[], bool]:
    """Ready when the service's consumer group is stable with a member (it has partitions)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def probe() -> bool:
        try:
            desc = admin.describe_consumer_groups([group_id])[group_id].result(timeout=5)
        except Exception:
            return False
        return bool(desc.members) and str(desc.state).endswith("STABLE")
    return probe
