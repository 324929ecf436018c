"""deploy/local stops only what it started: by the pid it recorded, never by a pattern.

``stop_recorded`` (deploy/local/common.sh) is what kafka.sh and kafka-cluster.sh stop with:
TERM, a bounded wait, then KILL; a pid file naming a process that is not ours (a recycled
pid) is forgotten without signalling anyone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentledger import settings
from agentledger.testing.polling import wait_until

COMMON = settings.REPO_ROOT / "deploy" / "local" / "common.sh"


def _stop(pidfile: Path, mark: str, grace: int) -> subprocess.CompletedProcess[str]:
    script = f'source "{COMMON}"; stop_recorded "{pidfile}" "{mark}" test {grace}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          check=True)


def _gone(proc: subprocess.Popen[bytes], deadline_s: float) -> bool:
    return wait_until(lambda: proc.poll() is not None, timeout=deadline_s, interval=0.05)


def _idle(marker: Path, *, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A process whose command line names ``marker``, as a broker's names its properties;
    returned once its signal handling is in place (it touches ``<marker>.ready``)."""
    ready = marker.with_suffix(".ready")
    code = ("import pathlib, signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "pathlib.Path(sys.argv[2]).touch()\ntime.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(marker), str(ready)])
    assert wait_until(ready.exists, timeout=30, interval=0.05)
    return proc


def test_the_recorded_process_is_stopped_and_its_pid_file_forgotten(tmp_path: Path) -> None:
    marker = tmp_path / "server.properties"
    proc = _idle(marker)
    pidfile = tmp_path / "x.pid"
    pidfile.write_text(str(proc.pid))
    out = _stop(pidfile, str(marker), 10)
    assert _gone(proc, 10) and proc.returncode == -15  # TERM was enough
    assert not pidfile.exists() and f"stopping test (pid {proc.pid})" in out.stderr


def test_a_process_ignoring_term_is_killed_after_the_grace(tmp_path: Path) -> None:
    marker = tmp_path / "stubborn.properties"
    proc = _idle(marker, ignore_term=True)
    pidfile = tmp_path / "x.pid"
    pidfile.write_text(str(proc.pid))
    out = _stop(pidfile, str(marker), 1)
    assert _gone(proc, 15) and proc.returncode == -9
    assert "forcing test" in out.stderr and not pidfile.exists()


def test_a_pid_file_naming_another_process_signals_nobody(tmp_path: Path) -> None:
    stranger = _idle(tmp_path / "someone-elses.properties")
    try:
        pidfile = tmp_path / "x.pid"
        pidfile.write_text(str(stranger.pid))
        _stop(pidfile, str(tmp_path / "server.properties"), 1)
        assert stranger.poll() is None and not pidfile.exists()
    finally:
        stranger.kill()
        stranger.wait(10)


def test_no_local_script_stops_by_a_command_line_pattern() -> None:
    for script in (settings.REPO_ROOT / "deploy" / "local").glob("*.sh"):
        text = script.read_text(encoding="utf-8")
        assert "pkill" not in text and "killall" not in text, script.name
