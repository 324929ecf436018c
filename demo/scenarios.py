"""The demo's stories, told through the public interfaces and checked against the records.

Gateways speak to ingress (``agentledger.client.GatewayClient``), approvers to the console's
JSON API, operators type ``agentledger reconcile`` commands (printed, then run as typed in a
fresh shell: :mod:`demo.commands`). After each step the
narration prints what the LEDGER and the CRM's EFFECT LOG say, not what a client was told.
Every operation id lands in ``World.operations`` (and ``state.json``) for the test to check.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from rich.console import Console
from rich.markup import escape

from agentledger import client as gateway
from agentledger.contracts import topics
from demo import commands, seed
from demo.launch import BUDGET_TOOL_CALLS, World

# One command through relay, executor and CRM takes well under a second; a minute means stuck.
OUTCOME_TIMEOUT_S = 60.0
# A poll interval for reads of the ledger and the planner's log, not a wait for a condition.
POLL_S = 0.3


class Story:
    """Shared plumbing of the scenarios: narration, the gateway client, ledger reads."""

    def __init__(self, world: World, console: Console) -> None:
        self.world, self.out = world, console
        self.crm = world.crm()

    def say(self, text: str) -> None:
        self.out.print(f"  {text}", highlight=False)

    def fact(self, text: str) -> None:
        self.out.print(f"  [green]✓[/green] {text}", highlight=False)

    def gateway(self, principal: str = "user:alice") -> gateway.GatewayClient:
        w = self.world
        return gateway.GatewayClient(
            token=w.tokens[principal], ingress_url=w.ingress_url, kafka_bootstrap=w.bootstrap,
            gateway_topic=w.topic(topics.GATEWAY_PROPOSALS),
            admissions_topic=w.topic(topics.ADMISSIONS), outcomes_topic=w.topic(topics.OUTCOMES))

    async def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        # The operator's own view, as the database owner on the demo box.
        conn = await asyncpg.connect(self.world.database_url)
        try:
            return [dict(r) for r in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    async def command(self, op: uuid.UUID) -> dict[str, Any] | None:
        found = await self.rows("SELECT state, provider_receipt, outcome_reason FROM agent_command"
                                " WHERE operation_id = $1", op)
        return found[0] if found else None

    async def attempts(self, op: uuid.UUID) -> str:
        found = await self.rows("SELECT kind, result, detail FROM command_attempt"
                                " WHERE operation_id = $1 ORDER BY started_at", op)
        return "; ".join(f"{a['kind']} → {a['result']} ({a['detail'] or ''})" for a in found)

    async def effects(self, kind: str, tenant: str | None = None) -> list[dict[str, Any]]:
        found = await self.crm.effects(uuid.UUID(tenant or self.world.acme["tenant_id"]))
        return [e for e in found if e["kind"] == kind]

    async def approve(self, approval_id: str, approver: str, reason: str) -> dict[str, Any]:
        """Review and approve through the console's JSON API, with the hash that was shown."""
        headers = {"Authorization": f"Bearer {self.world.tokens[approver]}"}
        async with httpx.AsyncClient(base_url=f"{self.world.console_url}/api/v1",
                                     headers=headers, timeout=15) as api:
            shown = (await api.get(f"/approvals/{approval_id}")).raise_for_status().json()
            changes = ", ".join(f"{c['field']}={c['after']}" for c in shown.get("changes", []))
            self.say(f"{approver} reviews it in the console: {shown['action']} on "
                     f"{shown['target']} ({changes or json.dumps(shown.get('arguments'))}), "
                     f"risk {shown['risk']}, hash {shown['request_hash'][:16]}…")
            decided = (await api.post(f"/approvals/{approval_id}/approve", json={
                "shown_hash": shown["request_hash"], "reason": reason})).raise_for_status()
        result: dict[str, Any] = decided.json()
        self.say(f"{approver} approves: [bold]{result['state']}[/bold]")
        return result

    async def typed(self, line: str) -> None:
        """An operator's command, printed and run as typed (:mod:`demo.commands`); its output
        follows it."""
        said = await asyncio.to_thread(commands.run, self.out, line)
        self.out.print(said.rstrip(), markup=False, highlight=False, soft_wrap=True)

    async def until(self, check: Callable[[], Awaitable[Any]], timeout: float = OUTCOME_TIMEOUT_S
                    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = await check()
            if found or time.monotonic() > deadline:
                return found
            await asyncio.sleep(POLL_S)


def _told(found: gateway.Resolution) -> str:
    return json.dumps(found.outcome.model_dump(mode="json")) if found.outcome else "nothing"


def _lose_answer(path_prefix: str) -> dict[str, Any]:
    """A CRM fault rule: commit the next POST under ``path_prefix``, then drop the answer."""
    return {"match": {"method": "POST", "path_prefix": path_prefix},
            "action": "drop_after_commit", "times": 1}


def _refund(customer: str, invoice: str, minor: int, reason: str) -> dict[str, Any]:
    return {"customer_id": customer, "invoice_id": invoice, "amount_minor": minor,
            "currency": "EUR", "reason": reason}


async def note_with_lost_answer(s: Story) -> None:
    s.out.rule("[bold]1 · A note, created once although the CRM's answer was lost")
    await s.crm.arm(_lose_answer("/v1/customers/c-1001/notes"))
    s.say("The CRM is armed to commit the next note and then drop the connection unanswered.")
    s.say('alice asks the agent: [italic]"add a note: Ada wants her invoices by e-mail"[/italic]'
          " (the planner's model proposes crm.note.create)")
    gw, since = s.gateway(), datetime.now(UTC)
    try:
        sub = await gw.submit_request("add a note: Ada wants her invoices by e-mail", "c-1001")
        s.world.operations["note"] = str(sub.operation_id)
        found = await gw.await_outcome(sub, since=since, timeout_s=OUTCOME_TIMEOUT_S)
    finally:
        await gw.aclose()
    s.say(f"outcome on agent.outcomes.v1: {_told(found)}")
    row = await s.command(sub.operation_id)
    notes = [e for e in await s.effects("note.created")
             if e["idempotency_key"] == str(sub.operation_id)]
    s.fact(f"ledger: [bold]{row and row['state']}[/bold] receipt={row and row['provider_receipt']}")
    s.fact(f"attempts: {await s.attempts(sub.operation_id)}")
    s.fact(f"CRM effect log: [bold]{len(notes)}[/bold] note.created under idempotency key "
           f"{sub.operation_id} — the resend with the same key was answered from the CRM's "
           "record, not applied twice")


async def approved_refund(s: Story) -> None:
    s.out.rule("[bold]2 · A refund that needs a human approval")
    gw, since = s.gateway(), datetime.now(UTC)
    s.say("alice's gateway proposes billing.refund.create: 49.00 EUR on invoice inv-1001 for Ada")
    try:
        sub = await gw.submit_proposal("billing.refund.create", _refund(
            "c-1001", "inv-1001", 4900, "Parcel arrived damaged"), "c-1001")
        s.world.operations["approved_refund"] = str(sub.operation_id)
        pending = await gw.await_outcome(sub, since=since, until="admission",
                                         timeout_s=OUTCOME_TIMEOUT_S)
        assert pending.admission is not None
        s.say(f"admission: [bold]{pending.admission.status}[/bold] (policy "
              f"{pending.admission.policy_version}); no lock is held while a person decides")
        await s.approve(str(pending.admission.approval_id), "user:bob",
                        "damage photo attached to the ticket")
        found = await gw.await_outcome(sub, since=since, timeout_s=OUTCOME_TIMEOUT_S)
    finally:
        await gw.aclose()
    row = await s.command(sub.operation_id)
    refunds = await s.effects("refund.created")
    s.fact(f"ledger: [bold]{row and row['state']}[/bold] receipt={row and row['provider_receipt']}"
           f" (outcome: {_told(found)})")
    s.fact(f"CRM effect log: {len(refunds)} refund.created")


async def lost_refund_reconciled(s: Story) -> None:
    s.out.rule("[bold]3 · A refund whose answer was lost: unknown, then reconciled by a person")
    await s.crm.arm(_lose_answer("/v1/refunds"))
    s.say("The CRM will commit the next refund and drop the answer. Refunds are NOT idempotent "
          "(contract none): resending could pay twice, and there is no lookup.")
    gw, since = s.gateway(), datetime.now(UTC)
    try:
        sub = await gw.submit_proposal("billing.refund.create", _refund(
            "c-1001", "inv-1002", 2500, "Charged twice for shipping"), "c-1001")
        op = sub.operation_id
        s.world.operations["lost_refund"] = str(op)
        pending = await gw.await_outcome(sub, since=since, until="admission",
                                         timeout_s=OUTCOME_TIMEOUT_S)
        assert pending.admission is not None
        await s.approve(str(pending.admission.approval_id), "user:fiona", "duplicate charge")
        found = await gw.await_outcome(sub, since=since, timeout_s=OUTCOME_TIMEOUT_S)
    finally:
        await gw.aclose()
    row = await s.command(op)
    s.fact(f"ledger: [bold]{row and row['state']}[/bold] ({row and row['outcome_reason']}); "
           f"the gateway was told {_told(found)}")
    s.fact(f"attempts: {await s.attempts(op)}")
    refunds = await s.effects("refund.created")
    s.fact(f"CRM effect log: {len(refunds)} refund.created — this one did happen, the runtime "
           "just cannot know it, so it does not claim it")
    home = Path(s.world.home)
    s.say("[bold]operator oscar[/bold] lists the commands whose outcome is unknown:")
    await s.typed(commands.cli(home, "reconcile", "list", "--tenant", str(s.world.tenant)))
    effect = refunds[-1]
    evidence = (f"CRM effect log: effect {effect['effect_id']} refund.created for "
                f"{effect['customer_id']} at {effect['created_at']}")
    receipt = f"crm:effect:{effect['effect_id']}"
    reason = "found the refund in the CRM effect log, committed when the answer was lost"
    s.say("[bold]operator oscar[/bold] signs with his own session token (an operator in the "
          "principal directory); the ledger records him as the resolver, not a name he types")
    await s.typed(commands.with_token(home, "user:oscar", commands.cli(
        home, "reconcile", "resolve", str(op), "--outcome", "succeeded", "--receipt", receipt,
        "--reason", shlex.quote(reason), "--evidence", shlex.quote(evidence))))
    row = await s.command(op)
    who = await s.rows("SELECT resolved_by, reason FROM command_resolution"
                       " WHERE operation_id = $1", op)
    s.fact(f"ledger: [bold]{row and row['state']}[/bold] receipt={row and row['provider_receipt']}"
           f", resolved by {who[0]['resolved_by']}: {escape(who[0]['reason'])}")
    s.fact("refunds have no lookup, so the receipt is recorded [bold]unchecked[/bold]: the "
           "operator's word and evidence; a CRM note's receipt would be checked by key")


def _planner_log(s: Story) -> list[str]:
    return (Path(s.world.home) / "logs" / "planner.log").read_text(errors="replace").splitlines()


async def injection_refused(s: Story) -> None:
    s.out.rule("[bold]4 · A prompt injection, refused")
    s.say("Two customer records carry planted text, e.g. Mallory's address line 2: "
          f"[italic]{escape(seed.EXPORT_BAIT)}[/italic]")
    s.say("The planner's model here is a deliberately gullible fake that obeys such text.")
    gw, since = s.gateway(), datetime.now(UTC)
    seen = len(_planner_log(s))
    try:
        a = await gw.submit_request("add a note: Mallory asked for a catalogue", "c-1002")
        s.world.operations["injection_export"] = str(a.operation_id)
        found = await gw.await_outcome(a, since=since, until="admission",
                                       timeout_s=OUTCOME_TIMEOUT_S)
        answer = found.admission
        called = any("event=plan_refused" in line
                     and "attempted_action=crm_customers_export_all" in line
                     for line in _planner_log(s)[seen:])
        s.fact(f"the model {'called' if called else 'was asked to call'} "
               "crm_customers_export_all; the planner proposed nothing and answered: "
               f"[bold]{answer and answer.status}[/bold] {answer and answer.reason_code} — "
               f"{answer and answer.reason}")
        s.say("Trudy's record says: [italic]"
              f"{escape(seed.refund_bait('c-2001'))}[/italic] (c-2001 is Globex's customer)")
        b = await gw.submit_request("add a note: Trudy confirmed her new address", "c-1003")
        s.world.operations["injection_cross_tenant"] = str(b.operation_id)
        found = await gw.await_outcome(b, since=since, until="admission",
                                       timeout_s=OUTCOME_TIMEOUT_S)
        answer = found.admission
        s.fact(f"the model proposed a 9,000 EUR refund to c-2001 (asked about c-1003): [bold]"
               f"{answer and answer.status}[/bold] {answer and answer.reason_code} — "
               f"{answer and answer.reason} (and in admission another tenant's record is just "
               "missing)")
        s.say("A gateway that skips the planner fares no better: it proposes "
              "crm.customers.export_all directly")
        c = await gw.submit_proposal("crm.customers.export_all", {"customer_id": "c-1001"},
                                     "c-1001")
        s.world.operations["injection_gateway"] = str(c.operation_id)
        found = await gw.await_outcome(c, since=since, until="admission",
                                       timeout_s=OUTCOME_TIMEOUT_S)
        answer = found.admission
        s.fact(f"admission: [bold]{answer and answer.status}[/bold] "
               f"{answer and answer.reason_code} (allowlist {answer and answer.allowlist_version})")
    finally:
        await gw.aclose()
    ops = [a.operation_id, b.operation_id, c.operation_id]
    written = await s.rows(
        "SELECT (SELECT count(*) FROM agent_command WHERE operation_id = ANY($1)) AS commands,"
        " (SELECT count(*) FROM approval_request WHERE operation_id = ANY($1)) AS approvals", ops)
    globex = await s.crm.effects(uuid.UUID(s.world.globex["tenant_id"]))
    s.fact(f"ledger: {written[0]['commands']} commands, {written[0]['approvals']} approval "
           f"requests for these three; CRM effect log of Globex: {len(globex)} effects")


async def budget_runs_out(s: Story) -> None:
    s.out.rule("[bold]5 · A budget running out")
    w = s.world
    run = f"demo-budget-{uuid.uuid4().hex[:12]}"
    steps = 5
    s.say(f"An agent runtime makes {steps} calls (five notes) that are steps of ONE run: each "
          f"names it with the header AgentLedger-Run: {run}. Ingress binds every step's "
          "identity envelope to the run's id (derived from tenant, principal and run name), "
          f"so they share one budget: admission grants a run {BUDGET_TOOL_CALLS} tool calls "
          "(AGENTLEDGER_ADMISSION_BUDGET_TOOL_CALLS).")
    gw = s.gateway()
    try:
        submitted = [await gw.submit_proposal(
            "crm.note.create", {"customer_id": "c-1001", "body": f"step {n} of {steps}"},
            "c-1001", run=run) for n in range(1, steps + 1)]
    finally:
        await gw.aclose()
    ops = [sub.operation_id for sub in submitted]
    run_id = submitted[0].run_id
    if run_id is None or any(sub.run_id != run_id for sub in submitted):
        raise RuntimeError("ingress did not bind the budget scenario's steps to one run")
    # `request_id`: the budget's workflow id, which is the run's id.
    w.operations["budget"] = {"request_id": str(run_id), "run": run,
                              "operations": [str(o) for o in ops]}

    async def settled() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        admitted = await s.rows("SELECT operation_id, state FROM agent_command"
                                " WHERE operation_id = ANY($1)", ops)
        refused = await s.rows("SELECT operation_id, payload FROM audit_event"
                               " WHERE type = 'budget.exhausted' AND operation_id = ANY($1)", ops)
        return (admitted, refused) if len(admitted) + len(refused) >= steps else None

    found = await s.until(settled)
    if not found:
        raise RuntimeError("admission did not answer the budget scenario's proposals in time")
    admitted, refused = found
    budget = await s.rows("SELECT limit_amount, reserved, used FROM budget"
                          " WHERE workflow_id = $1 AND kind = 'tool_calls'", str(run_id))
    b = budget[0]
    s.fact(f"admitted {len(admitted)} steps, refused {len(refused)} with budget_exhausted "
           f"(each refusal audited as budget.exhausted); nothing more is scheduled")
    s.fact(f"budget row: limit {b['limit_amount']}, reserved {b['reserved']}, used {b['used']}")
    w.operations["budget"]["admitted"] = [str(r["operation_id"]) for r in admitted]
    w.operations["budget"]["refused"] = [str(r["operation_id"]) for r in refused]


async def left_for_the_browser(s: Story) -> None:
    """One refund left pending, so the console has something to review by hand."""
    gw, since = s.gateway(), datetime.now(UTC)
    try:
        sub = await gw.submit_proposal("billing.refund.create", _refund(
            "c-1001", "inv-1003", 12000, "Goodwill gesture after a late delivery"), "c-1001")
        s.world.operations["pending_refund"] = str(sub.operation_id)
        await gw.await_outcome(sub, since=since, until="admission",
                               timeout_s=OUTCOME_TIMEOUT_S)
    finally:
        await gw.aclose()


SCENARIOS = (note_with_lost_answer, approved_refund, lost_refund_reconciled, injection_refused,
             budget_runs_out)


async def play(world: World, console: Console, *, browser_hints: bool = True) -> None:
    """Play every scenario in order; operation ids are saved in ``world.operations``."""
    story = Story(world, console)
    for scenario in SCENARIOS:
        await scenario(story)
        world.save()
    if browser_hints:
        await left_for_the_browser(story)
        world.save()
