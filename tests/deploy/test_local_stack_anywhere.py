"""deploy/local/stack.sh works from a checkout inside a 0700 directory (/root, a private home).

As root the scripts run PostgreSQL as the `postgres` user, which cannot traverse such a
directory: the cluster must then live outside the checkout, in a directory `postgres` owns
(recorded in .local/pg.location). As an ordinary user the server runs as that user, inside
the checkout's .local. A stand-in checkout (a copy of deploy/local) in a fresh 0700 temp
directory is brought up and down on free ports, beside the main stack and without touching it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg2
import pytest

from agentledger import settings
from agentledger.testing.polling import wait_until

SCRIPTS = settings.REPO_ROOT / "deploy" / "local"
KAFKA_LIBS = settings.REPO_ROOT / ".local" / "kafka" / "libs"
PG_HOME_ROOT = Path("/var/lib/agentledger")  # PG_HOME_ROOT in deploy/local/postgres.sh
AS_ROOT = os.geteuid() == 0
# Up and down take ~15 s (a cold Kafka JVM dominates); past this something hangs.
pytestmark = pytest.mark.timeout(240)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<{path} unreadable: {exc}>"


def _postgres_query(url: str, sql: str) -> str | None:
    """The one value ``sql`` returns, or None when the server does not answer."""
    try:
        conn = psycopg2.connect(url, connect_timeout=3)
    except psycopg2.OperationalError:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            row = cur.fetchone()
            return None if row is None else str(row[0])
    finally:
        conn.close()


def _kafka_answers(bootstrap: str) -> bool:
    probe = subprocess.run([sys.executable, str(SCRIPTS / "probe.py"), "kafka", bootstrap],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def _processes_in(data_dir: Path) -> list[str]:
    """Processes whose working directory is ``data_dir``: a postmaster and all its children."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == data_dir:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {cmd.strip()}")
        except OSError:
            continue  # gone, or not ours to look at
    return found


def _kill_postmaster(data_dir: Path) -> None:
    """Immediate shutdown (SIGQUIT) of the postmaster still running in ``data_dir``, if any."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    if any(p.startswith(f"{pid}:") for p in _processes_in(data_dir)):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGQUIT)
        wait_until(lambda: not _processes_in(data_dir), timeout=20)


def test_stack_up_and_down_from_a_checkout_in_a_0700_directory() -> None:
    assert (KAFKA_LIBS / ".complete").is_file(), (
        f"no Kafka jars in {KAFKA_LIBS} (.complete missing): the main stack's bootstrap "
        "(make up) fetches them; this test links them instead of downloading them again"
    )
    private = Path(tempfile.mkdtemp(prefix="al-0700-"))
    private.chmod(0o700)
    checkout = private / "checkout"
    local = checkout / ".local"
    shutil.copytree(SCRIPTS, checkout / "deploy" / "local", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (local / "kafka").mkdir(parents=True)
    (local / "kafka" / "libs").symlink_to(KAFKA_LIBS)
    # Where postgres.sh puts the cluster as root when `postgres` cannot reach .local.
    external = PG_HOME_ROOT / ("pg-" + hashlib.sha256(os.path.realpath(local).encode()).hexdigest()[:16])

    pg_port, kafka_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "AGENTLEDGER_LOCAL_DIR"}
    env |= {
        "AGENTLEDGER_PG_PORT": str(pg_port),
        "AGENTLEDGER_KAFKA_PORT": str(kafka_port),
        "AGENTLEDGER_KAFKA_CONTROLLER_PORT": str(_free_port()),
        "AGENTLEDGER_PYTHON": sys.executable,  # the stand-in checkout has no .venv of its own
    }
    url = f"postgresql://agentledger:agentledger@127.0.0.1:{pg_port}/agentledger"
    bootstrap = f"127.0.0.1:{kafka_port}"

    def stack(verb: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "deploy/local/stack.sh", verb], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=180)

    def pg_dir() -> Path:
        where = subprocess.run(["bash", "deploy/local/postgres.sh", "where"], cwd=checkout,
                               env=env, capture_output=True, text=True, timeout=30)
        return Path(where.stdout.strip() or local / "pg")

    def observed(step: subprocess.CompletedProcess[str] | None = None) -> str:
        out = f"\n--- stack.sh stderr ---\n{step.stderr[-4000:]}" if step else ""
        return (f"{out}\n--- postgres server.log (tail) ---\n{_tail(pg_dir() / 'log' / 'server.log')}"
                f"\n--- kafka stdout.log (tail) ---\n{_tail(local / 'kafka' / 'logs' / 'stdout.log')}")

    down_done = False
    data_dir = local / "pg" / "data"
    try:
        up = stack("up")
        assert up.returncode == 0, f"stack.sh up exited {up.returncode}{observed(up)}"

        answered = _postgres_query(url, "select current_setting('data_directory')")
        assert answered, f"PostgreSQL does not answer on 127.0.0.1:{pg_port}{observed(up)}"
        data_dir = Path(answered)
        if AS_ROOT:
            assert not data_dir.resolve().is_relative_to(private.resolve()), (
                f"as root the cluster must live outside the 0700 directory {private}; "
                f"data_directory={data_dir}")
            assert data_dir.parent == external, f"data_directory={data_dir}, expected under {external}"
            owner = pwd.getpwuid(data_dir.stat().st_uid).pw_name
            assert owner == "postgres", f"{data_dir} is owned by {owner}, not postgres"
            recorded = (local / "pg.location").read_text().strip()
            assert recorded == str(external), f".local/pg.location says {recorded!r}, expected {external}"
        else:
            assert data_dir.resolve().is_relative_to(local.resolve()), (
                f"as an ordinary user the cluster stays in the checkout's .local ({local}); "
                f"data_directory={data_dir}")
        assert _kafka_answers(bootstrap), f"Kafka does not answer on {bootstrap}{observed(up)}"

        down = stack("down")
        down_done = True
        assert down.returncode == 0, f"stack.sh down exited {down.returncode}{observed(down)}"
        assert wait_until(lambda: _postgres_query(url, "select 1") is None, timeout=20), (
            f"PostgreSQL still answers on 127.0.0.1:{pg_port} after stack.sh down{observed(down)}")
        assert wait_until(lambda: not _kafka_answers(bootstrap), timeout=20), (
            f"Kafka still answers on {bootstrap} after stack.sh down{observed(down)}")
        assert wait_until(lambda: not _processes_in(data_dir), timeout=20), (
            f"postgres processes still run in {data_dir} after stack.sh down: "
            f"{_processes_in(data_dir)}{observed(down)}")
    finally:
        if not down_done:
            stack("down")
        _kill_postmaster(data_dir)  # only if down failed: never leak a server
        if AS_ROOT:
            shutil.rmtree(external, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
