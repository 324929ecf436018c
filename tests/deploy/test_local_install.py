"""deploy/local installs quietly and waits for a busy package manager (issue 39).

- ``step`` (common.sh): one line on the terminal per step, the step's output in its log; a
  failure prints the log's end and path, and a command failing inside a function fails the
  step (``set -e`` holds in it);
- ``wait_for_apt``: another process holding an apt/dpkg lock is named and waited for, up to a
  bound, then the install goes on; past the bound it fails saying who holds it;
- the ports a stack was started on are read back from ``$LOCAL/env`` by a shell that sets none.

The locks here are files of the test's own, held with the same POSIX lock apt takes
(``fcntl``), so no real package manager is disturbed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentledger import settings
from agentledger.testing.polling import wait_until

COMMON = settings.REPO_ROOT / "deploy" / "local" / "common.sh"
HOLD = ("import fcntl, pathlib, sys, time\n"
        "f = open(sys.argv[1], 'w')\n"
        "fcntl.lockf(f, fcntl.LOCK_EX)\n"
        "pathlib.Path(sys.argv[1] + '.held').touch()\n"
        "time.sleep(600)\n")


def _bash(script: str, local: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f'source "{COMMON}"; {script}'], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "AGENTLEDGER_LOCAL_DIR": str(local), **env})


def _hold(lock: Path) -> subprocess.Popen[bytes]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)])
    assert wait_until(Path(f"{lock}.held").exists, timeout=30, interval=0.05)
    return holder


def test_a_step_prints_one_line_and_keeps_its_output_in_its_log(tmp_path: Path) -> None:
    done = _bash('step demo-ok "a quiet step" bash -c "echo lots of output; echo more >&2"',
                 tmp_path)
    assert done.returncode == 0 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("  ✓ a quiet step ("), done.stderr
    log = (tmp_path / "logs" / "demo-ok.log").read_text()
    assert "lots of output" in log and "more" in log


def test_a_failing_step_shows_the_end_of_its_log_and_its_path(tmp_path: Path) -> None:
    # A function whose first command fails: `set -e` must stop it there.
    script = ('broken() { echo "before the failure"; false; echo "never reached"; }; '
              'step demo-broken "a broken step" broken')
    done = _bash(script, tmp_path)
    log = tmp_path / "logs" / "demo-broken.log"
    assert done.returncode == 1
    assert f"✗ a broken step failed (exit 1); the end of {log}:" in done.stderr
    assert "before the failure" in done.stderr and "never reached" not in log.read_text()


def test_a_held_package_lock_is_waited_for_then_the_install_goes_on(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    holder = _hold(lock)
    err = tmp_path / "wait.err"
    with err.open("w") as out:
        waiting = subprocess.Popen(
            ["bash", "-c", f'source "{COMMON}"; wait_for_apt && echo free'],
            stdout=subprocess.PIPE, stderr=out, text=True,
            env={**os.environ, "AGENTLEDGER_LOCAL_DIR": str(tmp_path),
                 "AGENTLEDGER_APT_LOCKS": str(lock), "AGENTLEDGER_APT_LOCK_WAIT_S": "120"})
        try:
            assert wait_until(lambda: "waiting for it" in err.read_text(), timeout=30,
                              interval=0.05), err.read_text()
            assert waiting.poll() is None  # still waiting while the lock is held
            assert f"pid {holder.pid} (python" in err.read_text()
        finally:
            holder.kill()
            holder.wait()
        stdout, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0 and stdout.strip() == "free"
    assert err.read_text().count("waiting for it") == 1  # said once, not once a second


def test_a_lock_held_past_the_bound_fails_naming_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    holder = _hold(lock)
    try:
        done = _bash("wait_for_apt", tmp_path, AGENTLEDGER_APT_LOCKS=str(lock),
                     AGENTLEDGER_APT_LOCK_WAIT_S="2")
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 1
    assert f"pid {holder.pid} (python" in done.stderr and "still holds" in done.stderr


def test_the_ports_a_stack_was_started_on_are_read_back(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("export AGENTLEDGER_PG_PORT=45432\n"
                                  "export AGENTLEDGER_KAFKA_PORT=49092\n")
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_PORT")}
    remembered = subprocess.run(
        ["bash", "-c", f'source "{COMMON}"; echo "$PG_PORT $KAFKA_PORT $KAFKA_CONTROLLER_PORT"'],
        env={**clean, "AGENTLEDGER_LOCAL_DIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=30, check=True)
    assert remembered.stdout.split() == ["45432", "49092", "19093"]
    told = _bash('echo "$PG_PORT"', tmp_path, AGENTLEDGER_PG_PORT="45999")
    assert told.stdout.strip() == "45999"  # what the shell sets wins
