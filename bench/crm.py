"""The CRM stand-in's own cost: CPU per request of the routes the pipeline uses.

The stand-in is the provider both sides of the benchmark call; it must not be what the
benchmark measures (issue 20 §4: ≤ 0.5 CPU-ms per request). Notes are sent as the executor
sends them (``Idempotency-Key``, ``Fencing-Token``/``Fencing-Key``), reads as admission's
resolver does (``GET /v1/customers?id=…``), 16 in flight over one aiohttp session.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from agentledger.testing.crm import Crm, run_crm
from bench import procstats

IN_FLIGHT = 16


async def _measure(crm: Crm, pid: int, count: int) -> dict[str, Any]:
    tenant = await crm.new_tenant()
    cpu = procstats.Group({"crm": pid})
    notes = f"{crm.url}/v1/customers/{tenant.customer_id}/notes"
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {tenant.token}"}) as s:
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def note(i: int) -> None:
            key = str(uuid.uuid4())
            async with limit, s.post(notes, json={"body": f"bench note {i}"}, headers={
                    "Idempotency-Key": key, "Fencing-Token": "1", "Fencing-Key": key}) as r:
                if r.status != 201:
                    raise RuntimeError(f"note answered {r.status}: {await r.text()}")

        async def read(_: int) -> None:
            async with limit, s.get(f"{crm.url}/v1/customers", params=[
                    ("id", tenant.customer_id), ("id", "absent")]) as r:
                if r.status != 200:
                    raise RuntimeError(f"read answered {r.status}: {await r.text()}")

        await asyncio.gather(*(note(i) for i in range(IN_FLIGHT * 4)))  # warm-up
        for name, request in (("note", note), ("read", read)):
            before, began = cpu.cpu(), time.monotonic()
            await asyncio.gather(*(request(i) for i in range(count)))
            after, took = cpu.cpu(), time.monotonic() - began
            out[name] = {"requests": count, "per_s": round(count / took, 1),
                         "cpu_ms_per_request": round(
                             (after["crm"] - before["crm"]) * 1000.0 / count, 3)}
    return out


def run(database_url: str, count: int = 3000) -> dict[str, Any]:
    with run_crm(database_url, Path(tempfile.mkdtemp(prefix="al_bench_crm_"))) as crm:
        pid = procstats.child_pid("agentledger.services.crm")
        if pid is None:
            raise RuntimeError("the CRM process was not found")
        return asyncio.run(_measure(crm, pid, count))
