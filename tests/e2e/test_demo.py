"""``agentledger demo`` as a new user runs it: its narration must match the records, and every
command it prints must work when pasted into a fresh shell.

The demo runs as ``make demo`` runs it (default database, namespace and home, the console's
hints included) but in a checkout-local directory of its own (``AGENTLEDGER_LOCAL_DIR``) on
free ports: it starts its own Kafka and PostgreSQL there, so the ``make down`` it prints can
be run too without stopping the stack the other tests share. Every assertion reads the ledger,
the CRM's effect log or Mailpit's API, never only what the demo printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg2
import pytest

from agentledger import client, settings
from agentledger.testing import processes
from demo import launch
from demo import stack as demo_stack
from demo.stories_adoption import message_id

ROOT = settings.REPO_ROOT
# The stack's first start is ~15 s, start-up ~10 s and the scenarios ~20 s here; a loaded
# 2-core CI box may take several times that.
DEMO_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(DEMO_TIMEOUT_S + 300)


@dataclass(frozen=True)
class Played:
    world: launch.World
    out: str      # what the demo printed
    local: Path   # its AGENTLEDGER_LOCAL_DIR
    ports: dict[str, int]


def _fresh_env(**extra: str) -> dict[str, str]:
    """A new terminal's environment: no AGENTLEDGER_* variable, nothing of this test run."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "USER") if k in os.environ}
    return {**env, "LANG": "C.UTF-8", "COLUMNS": "200", **extra}


@pytest.fixture(scope="module")
def demo() -> Iterator[Played]:
    local = Path(tempfile.mkdtemp(prefix="al-demo-"))
    local.chmod(0o755)  # initdb and postgres run as the `postgres` user when we are root
    # What `make bootstrap` built for the checkout: Kafka's jars, Mailpit, Keycloak.
    (local / "kafka").mkdir()
    (local / "kafka" / "libs").symlink_to(ROOT / ".local" / "kafka" / "libs")
    (local / "bin").symlink_to(ROOT / ".local" / "bin")
    (local / "keycloak").symlink_to(ROOT / ".local" / "keycloak")
    ports = processes.free_ports({"pg": None, "standby": None, "kafka": None, "controller": None})
    stack_env = {"AGENTLEDGER_LOCAL_DIR": str(local), "AGENTLEDGER_PG_PORT": str(ports["pg"]),
                 "AGENTLEDGER_PG_STANDBY_PORT": str(ports["standby"]),
                 "AGENTLEDGER_KAFKA_PORT": str(ports["kafka"]),
                 "AGENTLEDGER_KAFKA_CONTROLLER_PORT": str(ports["controller"])}
    home = local / "demo"
    try:
        run = subprocess.run([sys.executable, "-m", "agentledger.cli", "demo"],
                             env=_fresh_env(**stack_env), cwd=ROOT, capture_output=True,
                             text=True, timeout=DEMO_TIMEOUT_S, check=False)
        logs = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-10:])
                         for p in sorted((home / "logs").glob("*.log")))
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
        # librdkafka's own lines go to the demo's log, never among the narration.
        assert not re.search(r"%\d\|", run.stdout + run.stderr), run.stderr
        yield Played(launch.World.load(home), run.stdout, local, ports)
    finally:
        started = demo_stack.running(home)
        demo_stack.stop_all(home)
        # Everything the demo started is stopped through its pid files, Mailpit included.
        assert [name for name, pid, _ in started if _alive(pid)] == []
        subprocess.run(["bash", str(ROOT / "deploy" / "local" / "stack.sh"), "down"],
                       env=_fresh_env(**stack_env), capture_output=True, timeout=120, check=False)
        shutil.rmtree(local, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def rows(world: launch.World, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(world.database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def effects(world: launch.World, tenant: dict[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    r = httpx.get(f"{world.crm_url}/admin/effects", params={"tenant": tenant["tenant_id"]},
                  headers={"Authorization": f"Bearer {world.crm_admin_token}"}, timeout=10)
    r.raise_for_status()
    return [e for e in r.json()["effects"] if kind is None or e["kind"] == kind]


def command(world: launch.World, op: str) -> tuple[str, str | None]:
    found = rows(world, "SELECT state, provider_receipt FROM agent_command WHERE operation_id = %s", op)
    assert found, f"no command {op}"
    return found[0][0], found[0][1]


def attempts(world: launch.World, op: str) -> list[tuple[str, str]]:
    return [(k, r) for k, r in rows(world, "SELECT kind, result FROM command_attempt"
                                    " WHERE operation_id = %s ORDER BY started_at", op)]


def test_note_with_a_lost_answer_is_one_effect_and_succeeded(demo: Played) -> None:
    world, out = demo.world, demo.out
    op = world.operations["note"]
    state, receipt = command(world, op)
    assert state == "succeeded" and receipt and receipt.startswith("crm:note:")
    assert attempts(world, op) == [("dispatch", "unknown"), ("resend", "succeeded")]
    notes = [e for e in effects(world, world.acme, "note.created") if e["idempotency_key"] == op]
    assert len(notes) == 1
    assert f"1 note.created under idempotency key {op}" in out


def test_refund_approved_through_the_console_succeeded(demo: Played) -> None:
    world, out = demo.world, demo.out
    op = world.operations["approved_refund"]
    state, receipt = command(world, op)
    assert state == "succeeded" and receipt and receipt.startswith("crm:refund:")
    assert rows(world, "SELECT state, decided_by FROM approval_request WHERE operation_id = %s",
                op) == [("approved", "user:bob")]
    assert "user:bob approves: approved" in out


def test_lost_refund_went_unknown_then_was_resolved_by_an_operator(demo: Played) -> None:
    world, out = demo.world, demo.out
    op = world.operations["lost_refund"]
    assert attempts(world, op) == [("dispatch", "unknown")]  # never resent: contract none
    state, receipt = command(world, op)
    assert state == "succeeded" and receipt and receipt.startswith("crm:effect:")
    (who, why, evidence), = rows(world, "SELECT resolved_by, reason, evidence FROM command_resolution"
                                 " WHERE operation_id = %s", op)
    assert who == "user:oscar" and why and evidence and "effect log" in evidence
    # Oscar signed with his session token; refunds have no lookup, so his word is recorded as such.
    assert why.startswith("[unchecked: connector billing declares no lookup"), why
    types = [t for (t,) in rows(world, "SELECT type FROM audit_event WHERE operation_id = %s ORDER BY seq", op)]
    assert "command.reconciled" in types
    # Two refunds happened in the CRM (the approved one and the lost one), no more.
    assert len(effects(world, world.acme, "refund.created")) == 2
    assert "ledger: unknown" in out and "resolved by user:oscar" in out
    assert "unchecked" in out.split("3 · A refund")[1]
    # The operator's steps are the commands he typed, printed and run as typed.
    told = out.split("3 · A refund")[1]
    assert f"{op}  billing.refund.create  connector=billing" in told
    assert f"resolved {op} as succeeded by user:oscar" in told
    assert f"operation {op}" in out.split("What is known, per operation")[1]


def test_injection_attempts_were_refused_with_zero_effects(demo: Played) -> None:
    world, out = demo.world, demo.out
    ops = [world.operations[k] for k in ("injection_export", "injection_cross_tenant", "injection_gateway")]
    for table in ("agent_command", "approval_request", "policy_decision"):
        assert rows(world, f"SELECT count(*) FROM {table} WHERE operation_id = ANY(%s::uuid[])",
                    ops) == [(0,)], table
    assert effects(world, world.globex) == []
    assert len(effects(world, world.acme, "refund.created")) == 2  # no 9,000 EUR refund anywhere
    planner_log = (Path(world.home) / "logs" / "planner.log").read_text(errors="replace")
    assert "attempted_action=crm_customers_export_all" in planner_log
    assert "rejected plan_unknown_action" in out
    assert "rejected plan_target_not_requested" in out and "rejected unknown_action" in out


def test_budget_refusals_are_recorded_and_nothing_more_is_admitted(demo: Played) -> None:
    world, out = demo.world, demo.out
    budget = world.operations["budget"]
    ops = budget["operations"]
    assert rows(world, "SELECT limit_amount, reserved, used FROM budget WHERE workflow_id = %s"
                " AND kind = 'tool_calls'", budget["request_id"]) == [(launch.BUDGET_TOOL_CALLS, 0, 3)]
    admitted = rows(world, "SELECT operation_id::text FROM agent_command WHERE operation_id = ANY(%s::uuid[])", ops)
    refused = rows(world, "SELECT operation_id::text FROM audit_event WHERE type = 'budget.exhausted'"
                   " AND operation_id = ANY(%s::uuid[])", ops)
    assert len(admitted) == 3 and len(refused) == 2
    assert sorted(o for (o,) in admitted) == sorted(budget["admitted"])
    assert "admitted 3 steps, refused 2 with budget_exhausted" in out


def mailpit(world: launch.World, op: str | None = None) -> list[dict[str, Any]]:
    """What Mailpit holds (every message, or those with this operation's Message-ID)."""
    if op is None:
        r = httpx.get(f"{world.mailpit_url}/api/v1/messages", params={"limit": 1000}, timeout=10)
    else:
        r = httpx.get(f"{world.mailpit_url}/api/v1/search",
                      params={"query": f"message-id:{message_id(op)}"}, timeout=10)
    r.raise_for_status()
    return list(r.json()["messages"])


def audit_types(world: launch.World, op: str) -> list[str]:
    return [t for (t,) in rows(world, "SELECT type FROM audit_event WHERE operation_id = %s ORDER BY seq", op)]


def test_an_email_from_the_outside_connector_is_sent_once_under_its_operation_id(demo: Played) -> None:
    world, out = demo.world, demo.out
    op = world.operations["email"]
    assert command(world, op) == ("succeeded", f"email:{message_id(op)}")
    assert attempts(world, op) == [("dispatch", "succeeded")]
    held = mailpit(world, op)
    assert len(held) == 1 and held[0]["MessageID"] == message_id(op)
    assert [t["Address"] for t in held[0]["To"]] == ["ada@example.com"]
    # Mailpit holds the story's two messages and nothing else: no message was sent twice.
    assert sorted(m["MessageID"] for m in mailpit(world)) == sorted(
        message_id(o) for o in (op, world.operations["email_lost"]))
    assert "entry points 'email' in agentledger.connectors and agentledger.resolvers: agentledger-email" in out
    assert f"Mailpit holds 1 message with Message-ID <{message_id(op)}>" in out


def test_an_email_whose_answer_was_lost_ends_succeeded_through_the_lookup(demo: Played) -> None:
    world, out = demo.world, demo.out
    op = world.operations["email_lost"]
    # The proxy lost the answer after Mailpit had accepted the message (read from the proxy).
    assert httpx.get(f"{world.smtp_fault_url}/healthz", timeout=10).json() == {"armed": False, "dropped": 1}
    # Contract none: never resent; the reconciler's lookup by Message-ID settled it.
    assert attempts(world, op) == [("dispatch", "unknown"), ("lookup", "succeeded")]
    assert command(world, op) == ("succeeded", f"email:{message_id(op)}")
    types = audit_types(world, op)
    assert "command.unknown" in types and types[-1] == "command.succeeded", types
    assert types.count("command.claimed") == 2, types  # the executor's send, the reconciler's lookup
    assert len(mailpit(world, op)) == 1
    assert "the proxy dropped 1 answer" in out
    assert f"Mailpit holds exactly 1 message with Message-ID <{message_id(op)}>" in out


def test_an_mcp_client_retrying_one_call_is_one_operation_and_one_note(demo: Played) -> None:
    world, out = demo.world, demo.out
    mcp = world.operations["mcp"]
    op = mcp["operation"]
    # The id ingress derives from alice's verified token and the key the client sent in _meta.
    assert op == str(client.operation_id_for(world.tokens["user:alice"], mcp["key"]))
    assert mcp["answers"] == [op, op, op]
    assert {"agentledger_status", "crm.note.create", "email.send"} <= set(mcp["tools"])
    state, receipt = command(world, op)
    assert state == "succeeded" and receipt and receipt.startswith("crm:note:")
    assert rows(world, "SELECT count(*) FROM agent_command WHERE operation_id = %s", op) == [(1,)]
    notes = [e for e in effects(world, world.acme, "note.created") if e["idempotency_key"] == op]
    assert len(notes) == 1
    assert f"3 calls, statuses succeeded, succeeded, succeeded; 1 operation id {op}" in out
    # The client came with no token: the 401 named the metadata, the metadata named the demo's
    # Keycloak, and the SDK's client-credentials provider got its token there.
    assert world.oauth_issuer.startswith("http://127.0.0.1:") and world.mcp_agent["client_id"]
    metadata = world.mcp_url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert f"without a token: HTTP 401, its challenge names {metadata}" in out
    assert f"which names the authorization server {world.oauth_issuer}" in out
    assert "got an access token (scope agentledger:tools" in out
    assert f"operation {op} took effect; receipt {receipt}" in out


def test_a_declared_rest_api_passes_the_conformance_kit_and_writes_once(demo: Played) -> None:
    world, out = demo.world, demo.out
    # The kit ran against the real CRM through the declaration: every declared claim held.
    assert world.operations["conformance"] == {
        "applies": True, "dedupes": True, "lookup_finds": True, "lookup_not_found": True,
        "if_match": True, "fencing": True, "lookup_ignores_lookalike": True, "answers": True}
    op = world.operations["declared"]
    state, receipt = command(world, op)
    assert state == "succeeded" and receipt and receipt.startswith("crm:note:")
    assert rows(world, "SELECT connector FROM agent_command WHERE operation_id = %s", op) == [("crmhttp",)]
    assert attempts(world, op) == [("dispatch", "succeeded")]
    notes = [e for e in effects(world, world.acme, "note.created") if e["idempotency_key"] == op]
    assert len(notes) == 1
    assert "8 · A REST API declared, not coded" in out


# ------------------------------------------------- every command it printed, pasted (last)


def _printed(out: str) -> list[str]:
    """The command lines the demo printed for a person: each alone, after ``$ ``."""
    return re.findall(r"^\s*\$ (.+?)\s*$", out, re.MULTILINE)


def _expected(line: str, world: launch.World, played: Played) -> list[str]:
    """What the pasted ``line`` must print, read from the records where they decide it."""
    if found := re.search(r"agentledger explain (\S+) --tenant (\S+)$", line):
        op = found[1]
        state, _ = command(world, op)
        assert found[2] == str(world.tenant)
        return [f"operation {op}", f"state={state}"]
    if re.search(r"agentledger reconcile list --tenant \S+$", line):
        return ["no unknown commands"]  # the one there was, the demo's operator resolved
    if found := re.search(r"agentledger reconcile resolve (\S+) --outcome succeeded", line):
        return [f"already resolved: {found[1]} is succeeded", "resolved by user:oscar",
                "nothing changed"]
    if re.fullmatch(r"cat \S+/tokens/bob", line):
        return [world.tokens["user:bob"]]
    if line.endswith("agentledger approvals list"):
        return [f"pending approvals · tenant {world.tenant}", "billing.refund.create"]
    if line.endswith("make status"):
        return [f"postgres: up 127.0.0.1:{played.ports['pg']}", "kafka: up", "demo ingress"]
    if line.endswith("make down"):
        return ["stopped the demo's services"]
    raise AssertionError(f"the demo printed a command this test does not know: {line!r}")


def test_every_command_the_demo_prints_works_pasted_in_a_fresh_shell(demo: Played) -> None:
    """Last in this module: the last command the demo prints is `make down`."""
    world = demo.world
    lines = _printed(demo.out)
    assert len([x for x in lines if " explain " in x]) == 5, lines  # the five operations admitted
    assert sum(" reconcile " in x for x in lines) == 2 and lines[-1].endswith("make down"), lines
    # A checkout-local directory of its own is the one thing the commands need set in front.
    prefix = f"AGENTLEDGER_LOCAL_DIR={demo.local} "
    assert all(x.startswith((prefix, f"AGENTLEDGER_TOKEN=$(cat {demo.local}/demo/tokens/",
                             f"cat {demo.local}/demo/tokens/")) for x in lines), lines
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=ROOT, env=_fresh_env(),
                              capture_output=True, text=True, timeout=120, check=False)
        said = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}\n{said}"
        assert "Traceback" not in said and "%3|" not in said, f"{line}\n{said}"
        for expected in _expected(line, world, demo):
            assert expected in said, f"{line}\n{said}"
    # `make down` stopped the demo's services and the stack it ran on.
    assert [name for name, pid, _ in demo_stack.running(demo.local / "demo") if _alive(pid)] == []
    assert not demo_stack.postgres_answers(world.database_url)
