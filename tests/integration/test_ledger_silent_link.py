"""A ledger transaction on a silent network fails while the network is still silent, instead
of waiting for the kernel's retransmission limit (~15 min).

The client runs in a network namespace (tests/netns.py) whose link to Postgres is cut
silently (every packet dropped) at one of two moments:

- before a statement: the transaction's own deadline cancels it, and the ROLLBACK that follows
  (on the same dead connection) is bounded too: the connection is closed, not reset;
- before the COMMIT, which has no client-side deadline (it may wait for the synchronous
  standby, legitimately, for long): only the socket's bound, ``repository.bound_silence``,
  ends it. The control without the bound discriminates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentledger.testing.polling import wait_until
from tests import netns, partition_env
from tests.stack import Stack

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("tc") is None or shutil.which("ip") is None,
    reason="needs root, ip netns and tc")

# The client, as a service runs one: a pool (its connections bounded or not), one transaction
# on a borrowed connection. It says "ready" where the link is to be cut (before the statement,
# or inside the transaction before its COMMIT), waits for the go file and prints how it ended.
CLIENT = """
import asyncio, os, sys
import asyncpg
from agentledger import errors
from agentledger.ledger import repository

async def wait_for(go):
    while not os.path.exists(go):
        await asyncio.sleep(0.05)

async def main(url, bounded, phase, go):
    async def init(conn):
        if bounded == "1":
            repository.bound_silence(conn)
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1, init=init)
    try:
        async with pool.acquire() as conn:
            if phase == "statement":
                print("ready", flush=True)
                await wait_for(go)
            async with repository.transaction(conn, None, timeout=60 if phase == "commit" else 5) as tx:
                await tx.fetchval("SELECT 1")
                if phase == "commit":
                    print("ready", flush=True)
                    await wait_for(go)
        print("answered", flush=True)
    except errors.StorageError as exc:
        print(f"failed retryable={exc.retryable}: {exc}", flush=True)
    pool.terminate()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def hub(stack: Stack) -> Iterator[partition_env.Hub]:
    with partition_env.hub(stack.database_url) as h:
        yield h


@pytest.mark.parametrize(("phase", "bounded"), [
    ("statement", False), ("commit", True), ("commit", False)],
    ids=["statement-unbounded", "commit-bounded", "commit-unbounded"])
def test_a_transaction_on_a_silent_link_fails_before_the_link_returns(
        stack: Stack, hub: partition_env.Hub, tmp_path: Path, phase: str, bounded: bool) -> None:
    go = tmp_path / "go"
    out = tmp_path / "client.out"
    with netns.Namespace(f"sl{os.getpid() % 100000}") as ns, out.open("w") as sink:
        client = subprocess.Popen(
            ns.argv([sys.executable, "-c", CLIENT, partition_env.via(stack.database_url, hub.pg),
                     "1" if bounded else "0", phase, str(go)]),
            stdout=sink, stderr=subprocess.STDOUT)
        try:
            assert wait_until(lambda: "ready" in out.read_text(), timeout=60), out.read_text()
            ns.cut()
            go.touch()
            assert wait_until(lambda: ns.dropped() > 0, timeout=30)  # the cut struck
            if phase == "statement" or bounded:
                # Fails while the link is still cut: the statement by the transaction's 5 s
                # deadline and a bounded ROLLBACK; the COMMIT by the kernel giving up on the
                # silent server (TCP_USER_TIMEOUT).
                assert wait_until(lambda: "failed" in out.read_text(), timeout=90), out.read_text()
                assert "failed retryable=True" in out.read_text(), out.read_text()
                assert ns.dropped() > 0
                ns.heal()
                assert client.wait(timeout=60) == 0, out.read_text()
            else:
                # The control (the test discriminates): well past the 10 s the bounded client
                # needs, this COMMIT still waits on the dead connection. It is not waited for:
                # its retransmissions back off to tens of seconds, so it would answer long
                # after a heal.
                assert not wait_until(lambda: "failed" in out.read_text() or
                                      client.poll() is not None, timeout=20), out.read_text()
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
