"""The relay's connections carry the same bound on a silent network as the services' asyncpg
pools (ledger.repository.bound_silence): the kernel drops a connection whose data the server
stopped acknowledging after TCP_USER_TIMEOUT, and probes an idle one (keepalive). The
behaviour on a real partition is libpq's and the kernel's (tests/chaos/test_partitions.py cuts
the relay's link); here: the options are on the very sockets the relay uses."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from agentledger.ledger import repository as ledger_repository
from agentledger.relay import repository


def _options(conn: Any) -> tuple[int, int]:
    sock = socket.socket(fileno=socket.dup(conn.fileno()))
    try:
        return (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
    finally:
        sock.close()


@pytest.mark.parametrize("connect", [repository.connect, repository.connect_replication],
                         ids=["control", "replication"])
def test_the_relays_sockets_give_up_on_a_silent_server(database_url: str, connect: Any) -> None:
    conn = connect(database_url)
    try:
        user_timeout_ms, keepalive = _options(conn)
    finally:
        conn.close()
    assert user_timeout_ms == int(ledger_repository.TCP_USER_TIMEOUT_S * 1000)
    assert keepalive == 1
