"""`explain` over HTTP (R8.6): the console's JSON API, for the session's tenant only."""

from __future__ import annotations

import uuid

import httpx

from agentledger.testing.pipeline import Pipeline


def test_explain_over_http_answers_for_the_sessions_tenant_only(world: Pipeline) -> None:
    import uuid as _uuid

    op = world.propose("crm.note.create", {"body": "explained over HTTP"})
    world.wait_state(op, "succeeded")
    assert world.sessions is not None and world.console_url
    token = world.sessions.issue(world.tenant, "user:bob", ["approver"])
    r = httpx.get(f"{world.console_url}/api/v1/operations/{op}/explain",
                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["known"]["state"] == "succeeded" and body["known"]["receipt"].startswith("crm:note:")
    assert body["proposed"]["action"] == "crm.note.create"
    assert [d["stage"] for d in body["permitted"]["decisions"]] == ["admission", "dispatch"]
    assert [a["result"] for a in body["attempted"]] == ["succeeded"]
    other_tenant = next(iter(world.others))
    other = world.sessions.issue(other_tenant, "user:bob", ["approver"])
    for who, missing in ((other, op), (token, _uuid.uuid4())):
        r = httpx.get(f"{world.console_url}/api/v1/operations/{missing}/explain",
                      headers={"Authorization": f"Bearer {who}"}, timeout=30)
        assert r.status_code == 404, r.text


def test_a_huge_body_is_refused_before_anything_reads_it(world: Pipeline) -> None:
    # Issue 17: the console read a 150 MB unauthenticated body before answering 401.
    assert world.console_url
    url = f"{world.console_url}/api/v1/approvals/{uuid.uuid4()}/approve"
    declared = httpx.post(url, content=b"x" * (2 * 1024 * 1024), timeout=30)
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["code"] == "payload_too_large"
    # An ordinary request still gets its ordinary answer: unauthenticated is 401.
    small = httpx.post(url, json={"reason": "ok"}, timeout=30)
    assert small.status_code == 401, small.text
