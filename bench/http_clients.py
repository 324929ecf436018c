"""CPU per request of the HTTP clients a connector or resolver could use (issue 20 §4).

A keep-alive GET with a bearer token to a minimal server in another process (so the server's
CPU is not counted), 32 requests in flight, the client's process CPU divided by the count.
``python -m bench.http_clients`` prints the figures; ``make bench`` records them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import urllib3

SERVER = """
import asyncio, sys
from aiohttp import web
async def customer(request):
    return web.Response(body=b'{"customer_id":"c"}', headers={"ETag": '"7"'},
                        content_type="application/json")
app = web.Application()
app.router.add_get("/v1/customers/{cid}", customer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _measure(get: Callable[[int], Awaitable[None]], count: int, in_flight: int) -> float:
    """CPU milliseconds per request of ``get`` over ``count`` requests."""
    limit = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with limit:
            await get(i)

    await asyncio.gather(*(one(i) for i in range(50)))  # warm: connections, code paths
    cpu0 = time.process_time()
    await asyncio.gather(*(one(i) for i in range(count)))
    return (time.process_time() - cpu0) * 1000 / count


async def _all(url: str, count: int, in_flight: int) -> dict[str, float]:
    headers = {"Authorization": "Bearer t0ken"}
    out: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=5.0,
                                 limits=httpx.Limits(max_connections=in_flight)) as hx:
        async def hx_get(i: int) -> None:
            r = await hx.get(f"/v1/customers/c{i}", headers=headers)
            assert r.status_code == 200 and r.headers["ETag"]
        out["httpx"] = await _measure(hx_get, count, in_flight)
    async with aiohttp.ClientSession(
            url, timeout=aiohttp.ClientTimeout(total=5.0),
            connector=aiohttp.TCPConnector(limit=in_flight)) as aio:
        async def aio_get(i: int) -> None:
            async with aio.get(f"/v1/customers/c{i}", headers=headers) as r:
                await r.read()
                assert r.status == 200 and r.headers["ETag"]
        out["aiohttp"] = await _measure(aio_get, count, in_flight)
    # Blocking clients in worker threads (how the DBOS peer calls the CRM from its steps).
    pool = urllib3.PoolManager(maxsize=in_flight, timeout=urllib3.Timeout(connect=2.0, read=5.0))

    async def u3_get(i: int) -> None:
        def get() -> None:
            r = pool.request("GET", f"{url}/v1/customers/c{i}", headers=headers)
            assert r.status == 200 and r.headers["ETag"]
        await asyncio.to_thread(get)
    out["urllib3 (threads)"] = await _measure(u3_get, count, in_flight)
    with httpx.Client(base_url=url, timeout=5.0,
                      limits=httpx.Limits(max_connections=in_flight)) as sync_hx:
        async def hx_sync_get(i: int) -> None:
            def get() -> None:
                r = sync_hx.get(f"/v1/customers/c{i}", headers=headers)
                assert r.status_code == 200 and r.headers["ETag"]
            await asyncio.to_thread(get)
        out["httpx sync (threads)"] = await _measure(hx_sync_get, count, in_flight)
    return out


def run(count: int = 3000, in_flight: int = 32) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the HTTP test server did not start") from None
                time.sleep(0.05)  # the server process is starting: poll its port
        cpu_ms = asyncio.run(_all(f"http://127.0.0.1:{port}", count, in_flight))
    finally:
        server.terminate()
        server.wait(10)
    return {"http_client_cpu_ms_per_request": {k: round(v, 3) for k, v in cpu_ms.items()},
            "requests": count, "in_flight": in_flight}


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
