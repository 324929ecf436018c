"""The hostile-provider suite's world: the real ledger, admission, executor and reconciler
wired to the stand-ins (``hostile_provider``), and one example driven from admission to a
final state, then judged against what the provider did.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import agentledger_http
import aiohttp
import asyncpg
import pytest

from agentledger import admission, crypto, errors
from agentledger.approvals import repository as approvals
from agentledger.connectors import base, plugins
from agentledger.connectors import crm as crm_connectors
from agentledger.contracts import commands
from agentledger.contracts.proposals import ProposalV1
from agentledger.executor import dispatcher, reconciler
from agentledger.ledger import dispatch, keys
from agentledger.policy import allowlist, cedar
from agentledger.policy import repository as policy_repo
from agentledger.resources import MappingResolver
from agentledger.testing import identities
from agentledger.testing import ledger as test_ledger
from tests.integration.hostile_answers import FOLLOWED, SHORT_S, Answer, Plan
from tests.integration.hostile_provider import RECIPIENT, SENDER, Live, Provider

ACTIONS = {"crm": "crm.note.create", "billing": "billing.refund.create",
           "email": "email.send", "crmhttp": "crmhttp.note.create"}
# Per generation at most: the send, its reconnects and its resends.
CALLS = 1 + dispatcher.NOT_SENT_RETRIES + dispatcher.RESENDS


def operator_config(where: Path) -> tuple[allowlist.Allowlist, cedar.CedarPolicy]:
    """The packaged allowlist and policies, plus the e-mail package's and the declared API's
    action (as tests/e2e/test_email_pipeline.py and demo/adoption.py configure them)."""
    package = resources.files("agentledger_email")
    rules = json.loads(allowlist.DEFAULT_PATH.read_text())
    rules["actions"] += json.loads(package.joinpath("allowlist.json").read_text())["actions"]
    note = next(a for a in rules["actions"] if a["name"] == "crm.note.create")
    rules["actions"].append({**note, "name": ACTIONS["crmhttp"], "connector": "crmhttp",
                             "description": "A note, through the declared REST API."})
    (where / "allowlist.json").write_text(json.dumps(rules))
    shutil.copytree(cedar.DEFAULT_DIR, where / "policies")
    (where / "policies" / "30_email.cedar").write_text(
        package.joinpath("policies", "30_email.cedar").read_text())
    return (allowlist.Allowlist.load(where / "allowlist.json"),
            cedar.CedarPolicy(where / "policies"))


def connectors(provider: Provider) -> dict[str, base.Connector]:
    """The four connectors the project ships, pointed at the stand-ins and made as the
    services make them, every client's bound short (``SHORT_S`` a phase, twice it a call) so
    that an answer held past it costs the run a fraction of a second, not 14."""
    url = provider.http.url
    declared = agentledger_http.example("crm_notes", crm_url=url)
    declared["contract"] = {**declared["contract"], "call_timeout_s": 2 * SHORT_S}
    configured = {**plugins.defaults(url), "crmhttp": declared, "email": {
        "smtp_host": provider.mail.host, "smtp_port": provider.mail.port, "sender": SENDER,
        "lookup_url": url, "deployment_id": "hostile-suite", "timeout_s": SHORT_S}}
    with pytest.MonkeyPatch.context() as patch:
        # The CRM connectors' phases are module constants read when one is made.
        patch.setattr(crm_connectors, "CALL_TIMEOUT_S", 2 * SHORT_S)
        patch.setattr(crm_connectors, "TIMEOUT", aiohttp.ClientTimeout(
            total=2 * SHORT_S, connect=SHORT_S, sock_read=SHORT_S))
        made = plugins.load(configured)  # as the services make them (AGENTLEDGER_CONNECTORS)
    return made


@dataclass
class World:
    """The ledger's pools by role, the real admission, executor and reconciler."""

    provider: Provider
    pools: dict[str, asyncpg.Pool]
    admitter: admission.Admitter
    dispatcher: dispatcher.Dispatcher
    reconciler: reconciler.Reconciler
    authorizer: policy_repo.CedarAuthorizer
    rules: allowlist.Allowlist
    tenant: uuid.UUID
    bystander: uuid.UUID  # the tenant of the healthy command beside each sweep
    customer: str = "c-hostile"

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()
        for connector in self.dispatcher.connectors.values():
            await connector.aclose()
        await self.provider.close()


async def open_world(database_url: str, where: Path, *,
                     cap: int = dispatch.MAX_GENERATIONS) -> World:
    """The world, its executor and reconciler holding a command at ``cap`` generations."""
    provider = Provider()
    await provider.start()
    rules, policy = operator_config(where)
    made = connectors(provider)
    authorizer = policy_repo.CedarAuthorizer(policy)

    async def pool(role: str | None) -> asyncpg.Pool:
        async def init(conn: asyncpg.Connection) -> None:
            if role:
                await conn.execute(f"SET ROLE {role}")
        return await asyncpg.create_pool(database_url, min_size=1, max_size=4, init=init)

    pools = {name: await pool(role) for name, role in (
        ("executor", "agentledger_executor"), ("admission", "agentledger_admission"),
        ("reconciler", "agentledger_reconciler"), ("owner", None))}
    tenant, bystander = uuid.uuid4(), uuid.uuid4()
    directory: dict[tuple[uuid.UUID, str, str], str | None] = {
        (tenant, "email", RECIPIENT): None}
    for name in ("crm", "billing", "crmhttp"):
        directory[(tenant, name, "c-hostile")] = "1"
    async with pools["owner"].acquire() as conn:
        for t in (tenant, bystander):
            for principal, roles in identities.DEFAULT_PRINCIPALS.items():
                await policy_repo.put_principal(conn, t, principal, roles)
    tokens = {name: {str(t): f"token-{name}" for t in (tenant, bystander)}
              for name in ACTIONS}
    cipher = keys.PayloadCipher(crypto.MasterKey(uuid.uuid4().bytes * 2))
    return World(
        provider, pools,
        admission.Admitter(pool=pools["admission"], allowlist=rules,
                           resolver=MappingResolver(directory), authorizer=authorizer,
                           cipher=cipher),
        dispatcher.Dispatcher(pool=pools["executor"], connectors=made,
                              credentials=base.Credentials("write", tokens), cipher=cipher,
                              authorizer=authorizer, allowlist=rules, worker_id="w1",
                              max_generations=cap),
        reconciler.Reconciler(pool=pools["reconciler"], connectors=made,
                              credentials=base.Credentials("lookup", tokens),
                              worker_id="reconciler-1", max_generations=cap),
        authorizer, rules, tenant, bystander)


@dataclass
class Verdict:
    """One example's outcome and what is wrong with it (``problems``: kind, detail)."""

    connector: str
    state: str
    applied: bool
    lied: bool
    generation: int
    served: Counter[str]
    sweeps: int
    problems: list[tuple[str, str]]


ARGUMENTS = {
    "crm": {"customer_id": "c-hostile", "body": "a note"},
    "crmhttp": {"customer_id": "c-hostile", "body": "a note"},
    "billing": {"customer_id": "c-hostile", "invoice_id": "inv-1", "amount_minor": 4200,
                "currency": "EUR", "reason": "hostile provider"},
    "email": {"subject": "Your refund", "body": "It is on its way."},
}


class Example:
    """One command through the real path, its provider playing ``plan``."""

    def __init__(self, world: World, plan: Plan) -> None:
        self.w, self.plan, self.op = world, plan, uuid.uuid4()
        target = RECIPIENT if plan.connector == "email" else world.customer
        self.live = Live(self.op, plan, target)
        self.problems: list[tuple[str, str]] = []
        self.sweeps = 0

    async def run(self) -> Verdict:
        p = self.w.provider
        marks = (len(p.http.requests), len(p.http.applied), len(p.mail.messages),
                 len(p.second.requests), p.unrouted)
        p.live[str(self.op)] = self.live
        if self.plan.connector == "email":
            p.mail_live = self.live
        try:
            await self.admit()
            await self.drive()
        finally:
            del p.live[str(self.op)]
            p.mail_live = None
        row = await self.row()
        applied = (p.accepted(self.op, marks[2]) if self.plan.connector == "email" else
                   sum(1 for r in p.http.applied[marks[1]:]
                       if str(self.op) in (r.headers.get("idempotency-key"),
                                           r.headers.get("fencing-key"))))
        self.judge(row, applied, marks, await self.audited(row["state"]))
        return Verdict(self.plan.connector, row["state"], bool(applied), self.live.lied,
                       row["fencing_generation"], self.live.served, self.sweeps, self.problems)

    async def admit(self) -> None:
        w, action = self.w, ACTIONS[self.plan.connector]
        proposal = ProposalV1.model_validate_json(json.dumps({
            "schema": "agentledger.proposal.v1", "proposal_id": str(uuid.uuid4()),
            "tenant_id": str(w.tenant), "principal_id": "user:alice",
            "operation_id": str(self.op), "action": action,
            "arguments": ARGUMENTS[self.plan.connector], "target": self.live.target,
            "planner": {"name": "hostile-suite"}, "created_at": datetime.now(UTC).isoformat()}))
        result = await w.admitter.admit(proposal)
        if result.status == "pending_approval":  # a refund: a finance approver decides
            assert result.approval_id is not None
            async with w.pools["admission"].acquire() as conn:
                pending = await approvals.get(conn, w.tenant, result.approval_id)
                verdict = await w.authorizer.may_approve(
                    conn, tenant_id=w.tenant, approver_id="user:fiona",
                    requester_id=pending.principal_id, action=w.rules.get(action),
                    resource_id=pending.resource_id)
                _, result = await approvals.decide(
                    conn, w.tenant, result.approval_id, approver="user:fiona", approve=True,
                    shown_hash=pending.hash_hex, reason="looks right",
                    approver_decision=verdict)
        assert result is not None and result.status == "admitted", result

    async def row(self, op: uuid.UUID | None = None, tenant: uuid.UUID | None = None
                  ) -> asyncpg.Record:
        async with self.w.pools["owner"].acquire() as conn:
            row = await conn.fetchrow(
                "SELECT * FROM agent_command WHERE tenant_id = $1 AND operation_id = $2",
                tenant or self.w.tenant, op or self.op)
        assert row is not None
        return row

    async def drive(self) -> None:
        """Executor and reconciler, as production runs them, until the command is final or
        held for an operator — ``unknown`` and left alone by a sweep; time passes by writing
        it, never by waiting."""
        # Per generation at most: the republish of a requeue, the claim, a take-over's sweep.
        steps = 3 * (self.w.reconciler.max_generations + reconciler.RECOVERY_SLACK) + 3
        for _ in range(steps):
            row = await self.row()
            if row["state"] == "pending":
                if row["retry_at"] is not None:  # a requeue's backoff: republished when due
                    await self.time_passes()
                    await self.sweep()
                await self.dispatch()
            elif row["state"] == "dispatching":
                await self.time_passes()  # the lease and the call bound after it ran out
                await self.sweep()
            elif row["state"] == "unknown":
                if (await self.sweep()).get(self.op, "skipped") == "skipped":
                    return  # held
            else:
                return
        self.problems.append(("unbounded loop", f"not final after {steps} steps"))

    async def time_passes(self) -> None:
        async with self.w.pools["owner"].acquire() as conn:
            await conn.execute(
                "UPDATE agent_command SET lease_until = now() - interval '2 minutes' "
                "WHERE tenant_id = $1 AND operation_id = $2 AND state = 'dispatching'",
                self.w.tenant, self.op)
            await conn.execute(
                "UPDATE agent_command SET retry_at = now() - interval '1 second' "
                "WHERE tenant_id = $1 AND operation_id = $2 AND retry_at IS NOT NULL",
                self.w.tenant, self.op)

    async def dispatch(self) -> None:
        d = self.w.dispatcher
        begun = await d.begin(self.w.tenant, self.op)
        if begun.claim is None:
            self.problems.append(("executor raised", f"begin found {begun.disposition}"))
            return
        try:
            await d.complete(begun.claim)
        except errors.StaleClaim:
            if not self.live.fenced_answer:  # only the provider's own fencing refusal
                self.problems.append(("executor raised", "StaleClaim with nothing fenced"))
        except Exception as exc:  # what escapes the executor is what the suite looks for
            self.problems.append(("executor raised", repr(exc)[:300]))

    async def sweep(self) -> dict[uuid.UUID, reconciler.Action]:
        """One sweep with a healthy command of another tenant pending recovery beside ours:
        it must be recovered by the same sweep, whatever ours does."""
        healthy = await self.bystander()
        self.sweeps += 1
        try:
            done = await self.w.reconciler.sweep()
        except Exception as exc:
            self.problems.append(("stalled sweep", f"the sweep raised {exc!r:.300}"))
            return {}
        finally:
            del self.w.provider.live[str(healthy)]
        state = (await self.row(healthy, self.w.bystander))["state"]
        if done.get(healthy) != "succeeded" or state != "succeeded":
            self.problems.append(("stalled sweep", f"the healthy command was "
                                  f"{done.get(healthy)!r} ({state})"))
        if done.get(self.op) == "failed":
            self.problems.append(("sweep item raised", "the reconciler's item raised"))
        return done

    async def bystander(self) -> uuid.UUID:
        """A CRM note of the other tenant whose answer was lost after the provider applied
        it: `unknown`, newer than ours, so the sweep reaches it after ours."""
        op, w = uuid.uuid4(), self.w
        live = Live(op, Plan("crm", lookups=(Answer("truthful", truthful=True),),
                             fences=(Answer("truthful", truthful=True),)), "res-1", applied=1)
        w.provider.live[str(op)] = live
        async with w.pools["owner"].acquire() as conn:
            await test_ledger.admit(conn, test_ledger.Command(w.bystander, op, "crm"))
        async with w.pools["executor"].acquire() as conn:
            held = await dispatch.claim(conn, w.bystander, op, worker_id="lost",
                                        lease_s=60, connectors=["crm"])
            assert held is not None
            await dispatch.mark_sending(conn, held, call_s=1.0)
            await dispatch.finalize(conn, held, "unknown", reason="the answer was lost")
        return op

    async def audited(self, state: str) -> tuple[str | None, str | None]:
        """The receipt and reason of the command's newest ``command.<state>`` audit event."""
        async with self.w.pools["owner"].acquire() as conn:
            found = await conn.fetchval(
                "SELECT payload::text FROM audit_event WHERE tenant_id = $1 AND operation_id = $2"
                " AND type = $3 ORDER BY seq DESC LIMIT 1", self.w.tenant, self.op,
                f"command.{state}")
        payload = json.loads(found) if found else {}
        return payload.get("receipt"), payload.get("reason")

    def judge(self, row: asyncpg.Record, effects: int, marks: tuple[int, ...],
              audited: tuple[str | None, str | None]) -> None:
        """What is wrong with the outcome for what the provider did (``effects``: the
        requests it applied, the messages it kept)."""
        state, p, cap = row["state"], self.w.provider, self.w.reconciler.max_generations
        applied = effects > 0
        if effects > 1 and not self.live.lied and (
                not self.w.reconciler.connectors[self.plan.connector].contract.may_resend):
            self.problems.append(("second effect", f"{effects} effects of a command whose "
                                  "contract never resends"))
        if state == "succeeded" and not applied:
            self.problems.append(("false success", f"succeeded ({row['provider_receipt']!r:.80})"
                                  " but the provider applied nothing"))
        if applied and not self.live.lied and state not in ("succeeded", "unknown"):
            self.problems.append(("applied effect recorded as not done",
                                  f"{state}: {row['outcome_reason']!r:.200}"))
        if applied and any(k == "executor raised" or k == "sweep item raised"
                           for k, _ in self.problems):
            self.problems.append(("unrecordable applied effect", "a write raised"))
        if state not in commands.TERMINAL_STATES and state != "unknown":
            self.problems.append(("unbounded loop", f"left {state}"))
        if row["fencing_generation"] > cap + reconciler.RECOVERY_SLACK:
            self.problems.append(("past the generation cap", str(row["fencing_generation"])))
        if p.unrouted > marks[4]:  # another command's provider, called after it was done
            self.problems.append(("unbounded loop", f"{p.unrouted - marks[4]} calls for "
                                  "commands already final or held"))
        calls = self.live.seen["write"] + self.live.seen["smtp"]
        if calls > CALLS * (cap + reconciler.RECOVERY_SLACK):
            self.problems.append(("past the generation cap", f"{calls} calls to the provider"))
        receipt, reason = row["provider_receipt"], row["outcome_reason"]
        if state == "succeeded" and not _storable(receipt, 512):
            self.problems.append(("text not storable", f"receipt {receipt!r:.80}"))
        if state != "succeeded" and not _storable(reason, 500):
            self.problems.append(("text not storable", f"reason {reason!r:.80}"))
        if audited != (receipt, reason if state != "succeeded" else audited[1]):
            self.problems.append(("text not storable", f"the audit trail says {audited!r:.200}"
                                  f" for the state {state} ({receipt!r:.80}, {reason!r:.80})"))
        followed = [r.path for r in p.http.requests[marks[0]:] if r.path.startswith(FOLLOWED)]
        if followed or len(p.second.requests) > marks[3]:
            self.problems.append(("redirect followed", f"{followed[:2]} and "
                                  f"{len(p.second.requests) - marks[3]} at the second host"))


def _storable(text: object, bound: int) -> bool:
    return (isinstance(text, str) and 0 < len(text) <= bound and text.strip() != ""
            and "\x00" not in text)
