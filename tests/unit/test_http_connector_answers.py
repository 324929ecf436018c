"""The declarative HTTP connector classifies what a declared API answers (issue 38): dot
segments refused before anything is sent, redirects never followed, 409 under the key in
doubt, a lookup settled only by an answer that identifies this operation's effect."""

from __future__ import annotations

import json
import uuid
from typing import Any

import agentledger_http
import pytest

from agentledger.connectors import Applied, Call, InDoubt, NotFound, Refused, hostile


def declared(url: str) -> dict[str, Any]:
    found = agentledger_http.example("crm_notes", crm_url=url)
    found["actions"] = {"crm.note.create": found["actions"]["crmhttp.note.create"]}
    return {k: v for k, v in found.items() if not k.endswith("factory")}  # the factory's own


def call(target: str = "c-1") -> Call:
    return Call(uuid.uuid4(), uuid.uuid4(), "crm.note.create", target,
                {"customer_id": target, "body": "x"}, None, fencing_generation=1)


@pytest.mark.parametrize("target", ["..", ".", "%2e%2e"])
async def test_a_dot_segment_target_is_refused_before_anything_is_sent(target: str) -> None:
    async with hostile.http(lambda _r: hostile.HttpAnswer(201, b'{"note_id": "n"}')) as api:
        connector = agentledger_http.connector(declared(api.url))
        try:
            found = await connector.execute(call(target), "t")
        finally:
            await connector.aclose()
    if target == "%2e%2e":  # percent-encoded by the connector itself: "%252e%252e", harmless
        assert api.requests and "/v1/customers/%252e%252e/notes" in api.requests[0].path
        return
    assert isinstance(found, Refused) and "another route" in found.reason, found
    assert api.requests == []


async def test_a_redirect_and_a_409_are_in_doubt() -> None:
    for answer in (hostile.HttpAnswer(302, b"", headers=(("Location", "/elsewhere"),)),
                   hostile.HttpAnswer(409, b'{"error": "still processing"}', applies=True)):
        async with hostile.http(lambda _r, a=answer: a) as api:  # type: ignore[misc]
            connector = agentledger_http.connector(declared(api.url))
            try:
                assert isinstance(await connector.execute(call(), "t"), InDoubt)
            finally:
                await connector.aclose()
        assert len(api.requests) == 1  # never followed


async def test_a_lookup_settles_only_on_an_answer_naming_this_operation() -> None:
    c = call()
    ours = {"idempotency_key": str(c.operation_id), "status": 201,
            "response": {"note_id": "n-1", "customer_id": "c-1"}}
    for body, expected in ((ours, Applied), ({**ours, "idempotency_key": "another"}, InDoubt),
                           ({**ours, "response": {"note_id": "n-1", "customer_id": "c-2"}},
                            InDoubt), ([ours], InDoubt)):
        async with hostile.http(lambda _r, b=body: hostile.HttpAnswer(  # type: ignore[misc]
                200, json.dumps(b).encode())) as api:
            connector = agentledger_http.connector(declared(api.url))
            try:
                found = await connector.lookup(c, "t")
            finally:
                await connector.aclose()
        assert isinstance(found, expected), (body, found)
    async with hostile.http(lambda _r: hostile.HttpAnswer(404, b"{}")) as api:
        connector = agentledger_http.connector(declared(api.url))
        try:
            assert isinstance(await connector.lookup(c, "t"), NotFound)
        finally:
            await connector.aclose()


async def test_the_fence_is_advanced_as_declared() -> None:
    async with hostile.http(lambda r: hostile.HttpAnswer(200, json.dumps({
            "fencing_key": "k", "token": int(r.headers["fencing-token"])}).encode())) as api:
        connector = agentledger_http.connector(declared(api.url))
        try:
            c = call()
            from dataclasses import replace
            found = await connector.fence(replace(c, fencing_generation=7), "t")
        finally:
            await connector.aclose()
    assert found.__class__.__name__ == "Advanced" and found.generation == 7  # type: ignore[union-attr]
    assert (api.requests[0].method, api.requests[0].path) == ("PUT", f"/v1/fences/{c.operation_id}")
