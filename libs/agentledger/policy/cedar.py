"""The Cedar policy engine: allow, require human approval, or deny (R2.6, R2.9).

Model. Cedar answers yes/no, and agentledger needs three effects, so each command is put to
Cedar as two questions over the same principal, resource and context:

* ``AgentLedger::Action::"perform"``: may this principal have the action carried out at all?
  No → ``deny``.
* ``AgentLedger::Action::"perform_unattended"``: may it be carried out without a human?
  Yes → ``allow`` (auto-approved); no → ``require_approval``.

A third question, ``AgentLedger::Action::"approve"``, asks whether an approver may approve a
given command (:meth:`CedarPolicy.may_approve`). The agentledger action (name, risk, connector,
refund amount) travels in ``context.operation``; its risk comes from the allowlist, never from
the model. Forbids (revoked principal, another tenant's resource, self-approval, a large refund
approved by someone outside finance) beat every permit, so one forbid denies all questions.

Cedar skips a policy whose evaluation errors; a skipped forbid would fail open, so any
evaluation error here is a ``deny``. The policy files are validated against the schema when
loaded, which rules such errors out for well-formed requests.

The version is ``cedar/sha256:<hex>`` over the RFC 8785 canonical form of every policy file
and the schema, by file name: deterministic, and changed by any edit (reformatting included).

Principal data (roles, revocation) is looked up per evaluation through a
:class:`PrincipalDirectory`, so revoking a principal is a data change that stops queued work
at the executor's re-check before dispatch.

Answers are memoised per instance (:mod:`agentledger.policy.memo`), keyed on everything Cedar
is handed, the principal's roles and revocation as read now included; errors never are.
"""

from __future__ import annotations

import functools
import hashlib
import json
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol
from uuid import UUID

import cedarpy

from agentledger import canonical, errors, settings
from agentledger.policy import allowlist as allowlist_mod
from agentledger.policy import decision as decision_mod
from agentledger.policy import memo

DEFAULT_DIR: Final = Path(__file__).with_name("policies")
SCHEMA_FILE: Final = "schema.cedarschema.json"
_NS: Final = "AgentLedger"

# Every permit and forbid is named, so a persisted decision says which rules made it.
_Q_PERFORM: Final = "perform"
_Q_UNATTENDED: Final = "perform_unattended"
_Q_APPROVE: Final = "approve"
_Q_DENY: Final = "deny"

# Cedar's answer to one question: allowed, the determining @ids, errored.
Answer = tuple[bool, tuple[str, ...], bool]


def configured_dir() -> Path:
    """The operator's policy directory (``AGENTLEDGER_POLICY_DIR``), else the packaged one."""
    return settings.PolicySources().policy_dir or DEFAULT_DIR


@dataclass(frozen=True)
class Principal:
    """What the directory knows about a principal.

    Attributes:
        tenant_id: The tenant the principal belongs to.
        principal_id: Its id, as in verified session claims.
        roles: Its roles, e.g. ``agent-operator``, ``user``, ``approver``, ``finance-approver``.
        revoked: Whether it has been revoked; a revoked principal is denied everything.
    """

    tenant_id: UUID
    principal_id: str
    roles: frozenset[str] = frozenset()
    revoked: bool = False


class PrincipalDirectory(Protocol):
    """Where roles and revocations come from; read at every evaluation."""

    async def lookup(self, tenant_id: UUID, principal_id: str) -> Principal | None:
        """The principal of this tenant, or ``None`` if the tenant has no such principal."""
        ...


class InMemoryPrincipalDirectory:
    """A directory held in a dict, for unit tests and offline demos."""

    def __init__(self, principals: Mapping[tuple[UUID, str], Principal] | None = None) -> None:
        self._principals: dict[tuple[UUID, str], Principal] = dict(principals or {})

    def put(self, principal: Principal) -> None:
        """Add or replace a principal."""
        self._principals[(principal.tenant_id, principal.principal_id)] = principal

    def revoke(self, tenant_id: UUID, principal_id: str) -> None:
        """Mark a principal revoked (a no-op for an unknown one)."""
        found = self._principals.get((tenant_id, principal_id))
        if found is not None:
            self.put(Principal(found.tenant_id, found.principal_id, found.roles, revoked=True))

    async def lookup(self, tenant_id: UUID, principal_id: str) -> Principal | None:
        return self._principals.get((tenant_id, principal_id))


@dataclass(frozen=True)
class CedarDecision(decision_mod.Decision):
    """A :class:`~agentledger.policy.decision.Decision` with the Cedar rules that made it.

    Attributes:
        reasons: The ``@id`` of every policy that determined the effect (empty when the
            effect is a default deny: nothing permitted).
    """

    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyRequest:
    """One command put to the policy.

    Attributes:
        principal: The acting principal as the directory knows it.
        action: The allowlisted action (its risk and connector are trusted facts).
        resource_id: The target record.
        arguments: The validated arguments (the refund amount is read from them).
        resource_tenant_id: The tenant owning the target; the principal's tenant when
            ``None`` (the resolver only resolves in-tenant resources, R1.4).
    """

    principal: Principal
    action: allowlist_mod.ActionSpec
    resource_id: str
    arguments: Mapping[str, object] = field(default_factory=dict)
    resource_tenant_id: UUID | None = None


def _uid(kind: str, ident: str) -> dict[str, str]:
    return {"type": f"{_NS}::{kind}", "id": ident}


def _principal_uid(p: Principal) -> dict[str, str]:
    # Principal ids are unique per tenant only; the tenant (a UUID, no '/') prefixes them.
    return _uid("Principal", f"{p.tenant_id}/{p.principal_id}")


def _principal_entity(p: Principal) -> dict[str, Any]:
    return {
        "uid": _principal_uid(p),
        "attrs": {
            "tenant": {"__entity": _uid("Tenant", str(p.tenant_id))},
            "roles": sorted(p.roles),
            "revoked": p.revoked,
        },
        "parents": [],
    }


# A principal as Cedar is told of it (its entity's id, tenant, roles, revocation): a memo key.
_PrincipalKey = tuple[UUID, str, tuple[str, ...], bool]


def _principal_key(p: Principal) -> _PrincipalKey:
    # A key compares by ==, where True == 1: only a real bool may stand for revoked.
    if not isinstance(p.revoked, bool):
        raise TypeError(f"principal {p.principal_id!r}: revoked is not a bool")
    return (p.tenant_id, p.principal_id, tuple(sorted(p.roles)), p.revoked)


def _from_key(key: _PrincipalKey) -> Principal:
    return Principal(key[0], key[1], frozenset(key[2]), key[3])


def _operation(request: PolicyRequest) -> dict[str, object]:
    operation: dict[str, object] = {
        "name": request.action.name,
        "risk": request.action.risk,
        "connector": request.action.connector,
    }
    amount = request.arguments.get("amount_minor")
    if isinstance(amount, int) and not isinstance(amount, bool):
        operation["amount_minor"] = amount
    return operation


class _Unmemoised(Exception):
    """Answers with an error in them: returned to the asker, kept out of the memo (an
    ``lru_cache`` stores what its function returns, never what it raises). Never leaves
    this module."""

    def __init__(self, answers: tuple[Answer, ...]) -> None:
        super().__init__("errored Cedar answers")
        self.answers = answers


class CedarPolicy:
    """The policy set in ``policies/``, validated against its schema at load.

    Implements the :class:`~agentledger.policy.decision.Policy` protocol; :meth:`evaluate`
    is the richer entry point, :meth:`authorize` looks the principal up first.
    """

    def __init__(self, directory: Path | str | None = None, *,
                 memo_size: int | None = None) -> None:
        """Load and validate ``*.cedar`` and the schema from ``directory`` (default:
        ``AGENTLEDGER_POLICY_DIR``, else the packaged policies, the demo's). ``memo_size``:
        the bound of the memo of answers (default ``AGENTLEDGER_POLICY_MEMO_SIZE``; 0: off).

        Raises:
            errors.ValidationFailed: missing files, unparseable or invalid policies, a policy
                without an ``@id`` or an ``@id`` used twice.
        """
        source = Path(directory) if directory is not None else configured_dir()
        try:
            files = {p.name: p.read_text(encoding="utf-8") for p in sorted(source.glob("*.cedar"))}
            schema_text = (source / SCHEMA_FILE).read_text(encoding="utf-8")
        except OSError as exc:
            raise errors.ValidationFailed(f"Cedar policies in {source} unreadable: {exc}") from exc
        if not files:
            raise errors.ValidationFailed(f"no *.cedar policy files in {source}")
        text = "\n".join(files[name] for name in sorted(files))
        try:
            parsed = json.loads(cedarpy.policies_to_json_str(text))
            self._schema = cedarpy.Schema.from_json_str(schema_text)
            self._policies = cedarpy.PolicySet.from_str(text)
        except ValueError as exc:
            raise errors.ValidationFailed(f"Cedar policies in {source}: {exc}") from exc
        ids = [(p.get("annotations") or {}).get("id") for p in parsed["staticPolicies"].values()]
        if parsed["templates"] or not all(ids) or len(set(ids)) != len(ids):
            raise errors.ValidationFailed(
                f"Cedar policies in {source}: every policy needs a unique @id, no templates")
        checked = cedarpy.validate_policies(text, self._schema)
        if not checked.validation_passed:
            raise errors.ValidationFailed(
                f"Cedar policies in {source} do not match the schema: "
                + "; ".join(str(e) for e in checked.errors[:10]))
        content = {"format": "agentledger.cedar.v1", "schema": schema_text, "policies": files}
        digest = hashlib.sha256(canonical.canonical_bytes(content)).hexdigest()
        self._version = f"cedar/sha256:{digest}"
        self.policy_ids: frozenset[str] = frozenset(str(i) for i in ids)
        self.files: Mapping[str, str] = types.MappingProxyType(files)
        # Per instance: the memo answers for this policy set and schema only, and goes with them.
        self._memo = functools.lru_cache(
            maxsize=memo.configured_size() if memo_size is None else memo_size)(self._cedar)
        memo.register(self)

    @property
    def version(self) -> str:
        return self._version

    def memo_stats(self) -> memo.MemoStats:
        """Hits, misses, entries and bound of this instance's memo of answers."""
        info = self._memo.cache_info()
        return memo.MemoStats(info.hits, info.misses, info.currsize, info.maxsize or 0)

    def _ask(
        self, questions: list[str], principal: Principal, resource_id: str,
        resource_tenant: UUID, context: dict[str, object], extra: Sequence[Principal] = (),
    ) -> tuple[Answer, ...]:
        """(allowed, determining @ids, errored) per question, from the memo or from Cedar;
        ``extra``: principals the context names, whose entities Cedar needs too."""
        try:
            key = (tuple(questions), _principal_key(principal), resource_tenant, resource_id,
                   json.dumps(context), tuple(_principal_key(p) for p in extra))
        except (TypeError, ValueError):  # not JSON, or a principal Cedar could not parse
            return tuple((False, (), True) for _ in questions)
        try:
            return self._memo(*key)
        except _Unmemoised as exc:
            return exc.answers

    def _cedar(
        self, questions: tuple[str, ...], principal: _PrincipalKey, resource_tenant: UUID,
        resource_id: str, context: str, extra: tuple[_PrincipalKey, ...],
    ) -> tuple[Answer, ...]:
        """Cedar's answers: a function of these arguments and of the instance's policy set
        and schema alone, which is what lets the memo key on the arguments (see
        :mod:`agentledger.policy.memo`). Errored answers are raised, so never memoised."""
        asker = _from_key(principal)
        entities = [
            {"uid": _uid("Tenant", str(t)), "attrs": {}, "parents": []}
            for t in sorted({asker.tenant_id, resource_tenant}, key=str)
        ]
        resource = _uid("Resource", f"{resource_tenant}/{resource_id}")
        entities += [_principal_entity(asker), *(_principal_entity(_from_key(k)) for k in extra), {
            "uid": resource,
            "attrs": {"tenant": {"__entity": _uid("Tenant", str(resource_tenant))}},
            "parents": [],
        }]
        requests = [{
            "principal": _principal_uid(asker),
            "action": _uid("Action", q),
            "resource": resource,
            "context": context,
        } for q in questions]
        try:
            results = cedarpy.is_authorized_batch(requests, self._policies, entities, self._schema)
        except ValueError:  # a request Cedar cannot even parse is denied, like any error
            raise _Unmemoised(tuple((False, (), True) for _ in questions)) from None
        answers = []
        for r in results:
            names = r.diagnostics.id_annotations_by_reason
            answers.append((
                r.allowed,
                tuple(sorted(str(names.get(p, p)) for p in r.diagnostics.reasons)),
                bool(r.diagnostics.errors),
            ))
        if any(errored for _, _, errored in answers):
            raise _Unmemoised(tuple(answers))
        return tuple(answers)

    def _decision(
        self, effect: decision_mod.Effect, reason: str, reasons: tuple[str, ...] = ()
    ) -> CedarDecision:
        return CedarDecision(effect, self._version, reason, reasons=reasons)

    def evaluate(self, request: PolicyRequest) -> CedarDecision:
        """Decide allow / require_approval / deny for one command (see the module docstring)."""
        name = request.action.name
        resource_tenant = request.resource_tenant_id or request.principal.tenant_id
        (may, why, bad), (alone, why_alone, bad_alone) = self._ask(
            [_Q_PERFORM, _Q_UNATTENDED], request.principal, request.resource_id,
            resource_tenant, {"operation": _operation(request)},
        )
        if bad or bad_alone:
            return self._decision("deny", f"{name}: policy evaluation failed; denied")
        if not may:
            return self._decision(
                "deny", f"{name}: " + ("forbidden by " + ", ".join(why) if why
                                       else "no policy permits it for this principal"), why)
        if alone:
            return self._decision("allow", f"{name}: auto-approved by "
                                  + ", ".join(why_alone), why_alone)
        return self._decision("require_approval", f"{name}: needs human approval "
                              "(permitted by " + ", ".join(why) + ")", why)

    def may_approve(self, approver: Principal, request: PolicyRequest) -> CedarDecision:
        """Whether ``approver`` may approve the command of ``request`` (effect allow or deny)."""
        name = request.action.name
        resource_tenant = request.resource_tenant_id or request.principal.tenant_id
        requester = request.principal
        extra = () if _principal_uid(requester) == _principal_uid(approver) else (requester,)
        context = {"operation": _operation(request),
                   "requester": {"__entity": _principal_uid(requester)}}
        ((ok, why, bad),) = self._ask(
            [_Q_APPROVE], approver, request.resource_id, resource_tenant, context, extra)
        if bad:
            return self._decision("deny", f"{name}: approval check failed; denied")
        if ok:
            return self._decision("allow", f"{name}: approval permitted by " + ", ".join(why), why)
        return self._decision("deny", f"{name}: approver " + (
            "forbidden by " + ", ".join(why) if why else "has no approving role"), why)

    def may_deny(self, denier: Principal, *, tenant_id: UUID, action: str, risk: str,
                 connector: str, resource_id: str) -> CedarDecision:
        """Whether ``denier`` may refuse this tenant's pending request (effect allow or deny).

        A denial needs no arguments (they may be purged) and no allowlist entry (an action
        taken off the allowlist can still be refused): the request's own name, risk and
        connector go into ``context.operation``. Any evaluation error refuses.
        """
        operation = {"name": action, "risk": risk, "connector": connector}
        ((ok, why, bad),) = self._ask([_Q_DENY], denier, resource_id, tenant_id,
                                      {"operation": operation})
        if bad:
            return self._decision("deny", f"{action}: denial check failed")
        if ok:
            return self._decision("allow", f"{action}: denial permitted by " + ", ".join(why),
                                  why)
        return self._decision("deny", f"{action}: denier " + (
            "forbidden by " + ", ".join(why) if why else "has no approving role"), why)

    def decide(
        self, *, tenant_id: UUID, principal_id: str, action: allowlist_mod.ActionSpec,
        resource_id: str, principal: Principal | None = None,
        arguments: Mapping[str, object] | None = None, resource_tenant_id: UUID | None = None,
    ) -> CedarDecision:
        """The :class:`~agentledger.policy.decision.Policy` entry point.

        Without ``principal`` the principal is unknown to the policy (no roles), which
        denies: pass the directory's record, or use :meth:`authorize`.
        """
        known = principal if principal is not None else Principal(tenant_id, principal_id)
        if (known.tenant_id, known.principal_id) != (tenant_id, principal_id):
            return self._decision("deny", "principal record does not match the request")
        return self.evaluate(PolicyRequest(known, action, resource_id, dict(arguments or {}),
                                           resource_tenant_id or tenant_id))

    async def authorize(
        self, directory: PrincipalDirectory, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None, resource_tenant_id: UUID | None = None,
    ) -> CedarDecision:
        """Look the principal up in ``directory`` now, then :meth:`evaluate`.

        Admission calls this before admitting and the executor before each dispatch, so a
        revocation recorded in between takes effect on queued work (R2.6).
        """
        found = await directory.lookup(tenant_id, principal_id)
        return self.authorize_found(found, tenant_id=tenant_id, principal_id=principal_id,
                                    action=action, resource_id=resource_id, arguments=arguments,
                                    resource_tenant_id=resource_tenant_id)

    def authorize_found(
        self, found: Principal | None, *, tenant_id: UUID, principal_id: str,
        action: allowlist_mod.ActionSpec, resource_id: str,
        arguments: Mapping[str, object] | None = None, resource_tenant_id: UUID | None = None,
    ) -> CedarDecision:
        """:meth:`authorize` with the directory's record already in hand (None: the tenant
        has no such principal, which is denied)."""
        if found is None:
            return self._decision("deny", f"{action.name}: principal unknown in this tenant")
        return self.decide(tenant_id=tenant_id, principal_id=principal_id, action=action,
                           resource_id=resource_id, principal=found, arguments=arguments,
                           resource_tenant_id=resource_tenant_id)
