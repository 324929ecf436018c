"""The operator's budgets over principals, tenants and time, in money (issue 42, R16.3).

A budget file (``AGENTLEDGER_BUDGETS``, format ``agentledger.budgets.v1``) declares budgets:

- **scope** — ``run`` (the request id the identity envelope names), ``principal`` (the verified
  principal, whatever run it names) or ``tenant``;
- **window** — ``call`` (each command alone), ``hour`` or ``day``: *calendar* windows in UTC
  (the hour starting at :00, the day starting at 00:00 UTC), so every admission instance puts a
  command in the same window without coordination;
- **unit** — ``calls`` (1 per command), ``tokens`` (the model tokens the planner reported on
  the proposal) or ``amount``: the integer value of the action's ``amount_argument`` (minor
  units), counted only when the action's ``currency_argument`` equals the budget's
  ``currency``. A command in another currency is not counted by that budget: declare one
  budget per currency an action allows (``check-config`` warns about a currency the
  argument's enum allows and no budget counts).

``limit`` is in the unit (minor units for an amount). ``actions`` restricts a budget to some
actions (absent: every action). Admission turns a command into its *charges* here, in
memory; the ledger reserves them all or none in admission's one statement
(``agentledger_budget_charge_v1``, migration 0040), settles them when the command succeeds,
releases them when it ends without effect. The file's version is the SHA-256 of its RFC 8785
canonical form, like the allowlist's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentledger import canonical, errors
from agentledger.policy import allowlist as allowlist_mod

FILE_FORMAT: Final = "agentledger.budgets.v1"

Scope = Literal["run", "principal", "tenant"]
Window = Literal["call", "hour", "day"]
Unit = Literal["calls", "tokens", "amount"]
# The scope key of a tenant-wide budget: one running total per tenant.
TENANT_KEY: Final = "tenant"
# The ledger's CHECK on scope_key; a run or principal id longer than this is cut to a digest.
MAX_SCOPE_KEY_CHARS: Final = 200

Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
ArgName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]


class Budget(BaseModel):
    """One declared budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    scope: Scope
    window: Window
    unit: Unit
    # A bigint in the ledger; 10^15 minor units is more than any one tenant's day.
    limit: int = Field(ge=0, le=10**15)
    actions: tuple[Annotated[str, Field(max_length=200)], ...] | None = None
    amount_argument: ArgName | None = None
    currency_argument: ArgName | None = None
    currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$")] | None = None
    description: Annotated[str, Field(max_length=500)] | None = None

    @model_validator(mode="after")
    def _money_fields(self) -> Budget:
        money = (self.amount_argument, self.currency_argument, self.currency)
        if self.unit == "amount" and None in money:
            raise ValueError(f"budget {self.name}: unit 'amount' needs amount_argument, "
                             "currency_argument and currency")
        if self.unit != "amount" and any(m is not None for m in money):
            raise ValueError(f"budget {self.name}: amount_argument, currency_argument and "
                             "currency belong to unit 'amount' only")
        return self

    def applies_to(self, action: str) -> bool:
        return self.actions is None or action in self.actions


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["agentledger.budgets.v1"]
    budgets: tuple[Budget, ...] = Field(max_length=200)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one command costs one budget: reserved at admission, all charges or none."""

    budget: str
    scope: Scope
    scope_key: str
    window: Window
    window_start: datetime | None  # None for a per-call budget
    unit: Unit
    currency: str | None
    amount: int
    limit: int

    def as_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "scope": self.scope, "scope_key": self.scope_key,
                "window_kind": self.window, "unit": self.unit, "currency": self.currency,
                "window_start": self.window_start.isoformat() if self.window_start else None,
                "amount": self.amount, "limit": self.limit}


def window_start(window: Window, now: datetime) -> datetime | None:
    """The calendar UTC window ``now`` falls in (None for ``call``)."""
    now = now.astimezone(UTC)
    if window == "hour":
        return now.replace(minute=0, second=0, microsecond=0)
    if window == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    return None


def _scope_key(value: str) -> str:
    if len(value) <= MAX_SCOPE_KEY_CHARS:
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class Budgets:
    """A loaded, validated budget file. Empty (no budgets) when none is configured."""

    budgets: tuple[Budget, ...] = ()
    version: str = "none"
    path: Path | None = None

    @classmethod
    def load(cls, path: Path | str | None) -> Budgets:
        """Read and validate a budget file (None: no budgets).

        Raises:
            ValidationFailed: the file is missing, not JSON, or breaks the format — naming
            what (a budget's name and field).
        """
        if path is None:
            return cls()
        where = Path(path)
        try:
            document = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise errors.ValidationFailed(f"budgets {where}: cannot read JSON: {exc}") from exc
        return cls.parse(document, where)

    @classmethod
    def parse(cls, document: Any, path: Path | None = None) -> Budgets:
        try:
            parsed = _File.model_validate(document)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise errors.ValidationFailed(f"budgets: {at}: {first['msg']}") from exc
        names = [b.name for b in parsed.budgets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise errors.ValidationFailed(f"budgets: declared twice: {', '.join(twice)}")
        version = "sha256:" + hashlib.sha256(canonical.canonical_bytes(document)).hexdigest()
        return cls(parsed.budgets, version, path)

    def problems(self, rules: allowlist_mod.Allowlist) -> list[str]:
        """What does not fit the allowlist: an unknown action, an amount argument that is not
        an integer of the action, a currency argument that is not a string, a currency the
        argument never takes. Empty: usable with these actions."""
        found: list[str] = []
        for budget in self.budgets:
            for action in budget.actions or ():
                if action not in rules.actions:
                    found.append(f"budget {budget.name}: unknown action {action!r}")
            if budget.unit != "amount":
                continue
            named = [rules.actions[a] for a in (budget.actions or rules.actions)
                     if a in rules.actions]
            for spec in named:
                props = spec.schema.get("properties", {})
                amount = props.get(budget.amount_argument)
                currency = props.get(budget.currency_argument)
                if budget.actions is None and (amount is None or currency is None):
                    continue  # a budget over every action counts those that have both
                if not isinstance(amount, Mapping) or amount.get("type") != "integer":
                    found.append(f"budget {budget.name}: {spec.name}.{budget.amount_argument} "
                                 "is not an integer argument")
                if not isinstance(currency, Mapping) or currency.get("type") != "string":
                    found.append(f"budget {budget.name}: {spec.name}."
                                 f"{budget.currency_argument} is not a string argument")
                elif "enum" in currency and budget.currency not in currency["enum"]:
                    found.append(f"budget {budget.name}: {spec.name} never takes currency "
                                 f"{budget.currency} ({spec.name}.{budget.currency_argument} "
                                 f"is one of {currency['enum']})")
        return found

    def charges(self, *, action: str, arguments: Mapping[str, Any], principal_id: str,
                run_id: str | None, tokens: int, now: datetime) -> list[Charge]:
        """What this command costs each budget it falls under (pure, in memory).

        A ``run`` budget needs a run (the envelope's request id): without one it does not
        apply. A zero amount (no tokens reported) charges nothing.
        """
        out: list[Charge] = []
        for budget in self.budgets:
            if not budget.applies_to(action):
                continue
            amount = _amount(budget, arguments, tokens)
            if amount is None or amount <= 0:
                continue
            if budget.scope == "run":
                if run_id is None:
                    continue
                key = _scope_key(run_id)
            elif budget.scope == "principal":
                key = _scope_key(principal_id)
            else:
                key = TENANT_KEY
            out.append(Charge(
                budget=budget.name, scope=budget.scope, scope_key=key, window=budget.window,
                window_start=window_start(budget.window, now), unit=budget.unit,
                currency=budget.currency, amount=amount, limit=budget.limit))
        return out

    def describe(self) -> list[dict[str, Any]]:
        """The budgets as plain data (``check-config --json``)."""
        return [b.model_dump(exclude_none=True) for b in self.budgets]


def _amount(budget: Budget, arguments: Mapping[str, Any], tokens: int) -> int | None:
    if budget.unit == "calls":
        return 1
    if budget.unit == "tokens":
        return tokens
    assert budget.amount_argument is not None and budget.currency_argument is not None
    if arguments.get(budget.currency_argument) != budget.currency:
        return None
    value = arguments.get(budget.amount_argument)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def charges_json(charges: Sequence[Charge]) -> str | None:
    """The charges as the ledger function takes them (None: nothing to charge)."""
    return json.dumps([c.as_json() for c in charges]) if charges else None


Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """The clock that places a command in its window: the system's, in UTC."""
    return datetime.now(UTC)
