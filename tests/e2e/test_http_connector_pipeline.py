"""The declarative HTTP connector end to end: an API integrated by configuration alone (the
CRM stand-in's note API declared as connector ``crmhttp``), with its own allowlist entry and
executor, through admission, the relay and the executor — and a lost answer recovered by
resending the same key, one effect.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import agentledger_http
import pytest

from agentledger.policy import allowlist
from agentledger.testing.pipeline import Pipeline, pipeline
from tests.stack import Stack

ACTION = "crmhttp.note.create"


def operator_allowlist(where: Path) -> str:
    rules = json.loads(allowlist.DEFAULT_PATH.read_text())
    note = next(a for a in rules["actions"] if a["name"] == "crm.note.create")
    rules["actions"].append({**note, "name": ACTION, "connector": "crmhttp",
                             "description": "A note, through the declarative HTTP connector."})
    (where / "allowlist.json").write_text(json.dumps(rules))
    return str(where / "allowlist.json")


@pytest.fixture(scope="module")
def world(stack: Stack, database_url: str, make_database: Callable[[], str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    declaration = agentledger_http.example("crm_notes")  # "{crm_url}": the pipeline's CRM
    with pipeline(stack.kafka_bootstrap, database_url, make_database(),
                  tmp_path_factory.mktemp("http"), connectors={"crmhttp": declaration},
                  config_env={"AGENTLEDGER_ALLOWLIST": operator_allowlist(
                      tmp_path_factory.mktemp("operator"))}) as p:
        yield p


def notes(p: Pipeline, op: object) -> list[dict[str, Any]]:
    return [e for e in asyncio.run(p.crm.effects(p.tenant))
            if e["kind"] == "note.created" and e["idempotency_key"] == str(op)]


def recorded_note(p: Pipeline, op: object) -> str:
    """The note id the CRM recorded under the operation's key (its own lookup API)."""
    async def ask() -> str:
        async with p.crm.client(p.tokens["lookup"], timeout=10) as c:
            r = await c.get(f"/v1/operations/{op}")
        assert r.status_code == 200, r.text
        return str(r.json()["response"]["note_id"])
    return asyncio.run(ask())


def test_a_declared_api_is_written_once_by_its_own_executor(world: Pipeline) -> None:
    op = world.propose(ACTION, {"body": "declared, not coded"})
    state, receipt = world.wait_state(op, "succeeded", "failed", "unknown")
    assert (state, receipt) == ("succeeded", f"crm:note:{recorded_note(world, op)}")
    assert len(notes(world, op)) == 1
    assert "event=dispatched operation_id=" + str(op) in world.services[
        "executor-crmhttp"].tail(200)


def test_a_lost_answer_is_resent_under_the_same_key_and_applied_once(world: Pipeline) -> None:
    asyncio.run(world.crm.arm({"match": {"method": "POST", "path_prefix": "/v1/customers/"},
                               "action": "drop_after_commit", "times": 1}))
    op = world.propose(ACTION, {"body": "answer lost once"})
    state, receipt = world.wait_state(op, "succeeded", "failed", "unknown")
    assert (state, receipt) == ("succeeded", f"crm:note:{recorded_note(world, op)}")
    assert len(notes(world, op)) == 1
    assert asyncio.run(world.crm.armed()) == []  # the drop happened: the answer was lost
