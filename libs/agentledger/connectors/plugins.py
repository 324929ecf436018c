"""Finding connectors by name: entry points of installed distributions, or configuration.

A distribution offers connectors in its metadata::

    [project.entry-points."agentledger.connectors"]
    mailer = "acme_mailer:connector"        # a factory: options -> Connector

and the operator names the connectors a deployment uses, with their options, in
``AGENTLEDGER_CONNECTORS`` (JSON)::

    {"mailer": {"smtp_host": "mail.internal"},
     "tickets": {"factory": "acme_tickets.connector:make", "url": "https://…"}}

``factory`` (optional) points at a factory directly, for a connector not packaged as a
distribution. Unset, the deployment uses the demo's CRM and billing connectors.

Written here rather than taken from a plugin framework (pluggy, stevedore): the standard
library's ``importlib.metadata.entry_points`` is the whole discovery mechanism, and the rest
is checking that what a factory returns keeps the connector contract.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from agentledger import errors
from agentledger.connectors import base

GROUP = "agentledger.connectors"
Factory = Callable[[Mapping[str, Any]], base.Connector]
# The key of a connector's options naming its factory directly ("module:attribute").
FACTORY_KEY = "factory"


def installed() -> dict[str, EntryPoint]:
    """The connector entry points of every installed distribution, by connector name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def defaults(crm_url: str) -> dict[str, dict[str, Any]]:
    """The demo's deployment: the CRM and billing connectors, both on the CRM stand-in."""
    return {"crm": {"url": crm_url}, "billing": {"url": crm_url}}


def configured(options: Mapping[str, Mapping[str, Any]] | None,
               crm_url: str) -> Mapping[str, Mapping[str, Any]]:
    """The deployment's connectors: ``AGENTLEDGER_CONNECTORS`` when set, else the demo's."""
    return options if options is not None else defaults(crm_url)


def factory(name: str, options: Mapping[str, Any]) -> Factory:
    """The factory of connector ``name``: from its options' ``factory``, else its entry point.

    Raises:
        ConfigurationError: no such entry point, or the reference does not import.
    """
    reference = options.get(FACTORY_KEY)
    try:
        if reference is not None:
            if not isinstance(reference, str) or ":" not in reference:
                raise errors.ConfigurationError(
                    f"connector {name!r}: factory must be 'module:attribute'",
                    connector=name, factory=reference)
            module, _, attribute = reference.partition(":")
            found: Any = importlib.import_module(module)
            for part in attribute.split("."):
                found = getattr(found, part)
        else:
            point = installed().get(name)
            if point is None:
                raise errors.ConfigurationError(
                    f"no connector {name!r} is installed (entry point group {GROUP!r}) and "
                    f"its options name no {FACTORY_KEY!r}", connector=name,
                    installed=sorted(installed()))
            found = point.load()
    except (ImportError, AttributeError) as exc:
        raise errors.ConfigurationError(f"connector {name!r} cannot be imported: {exc}",
                                        connector=name) from exc
    if not callable(found):
        raise errors.ConfigurationError(f"connector {name!r}: its factory is not callable",
                                        connector=name)
    return found  # type: ignore[no-any-return]


def make(name: str, options: Mapping[str, Any]) -> base.Connector:
    """One connector, made by its factory from ``options`` and checked against the contract.

    Raises:
        ConfigurationError: it cannot be found or made, or what was made is not a connector
            named ``name``.
    """
    make_one = factory(name, options)
    own = {k: v for k, v in options.items() if k != FACTORY_KEY}
    try:
        connector = make_one(own)
    except errors.AgentLedgerError:
        raise
    except Exception as exc:  # a third-party factory: any failure is a configuration error
        raise errors.ConfigurationError(f"connector {name!r} could not be made: {exc}",
                                        connector=name) from exc
    check(name, connector)
    return connector


def check(name: str, connector: object) -> None:
    """That ``connector`` keeps the shape the services rely on.

    Raises:
        ConfigurationError: with every way it does not.
    """
    problems = []
    if getattr(connector, "name", None) != name:
        problems.append(f"its name is {getattr(connector, 'name', None)!r}, not {name!r}")
    actions = getattr(connector, "actions", None)
    if not isinstance(actions, frozenset) or not actions or not all(
            isinstance(a, str) for a in actions):
        problems.append("actions must be a non-empty frozenset of action names")
    contract = getattr(connector, "contract", None)
    if not isinstance(contract, base.Contract):
        problems.append("contract must be an agentledger.connectors.Contract")
    elif contract.lookup and not inspect.iscoroutinefunction(getattr(connector, "lookup", None)):
        problems.append("its contract declares lookup, but it has no async lookup()")
    scopes = getattr(connector, "scopes", None)
    if not isinstance(scopes, frozenset) or not scopes <= {"read", "write", "lookup"}:
        problems.append("scopes must be a frozenset of 'read', 'write', 'lookup'")
    for method in ("execute", "aclose"):
        if not inspect.iscoroutinefunction(getattr(connector, method, None)):
            problems.append(f"it has no async {method}()")
    if problems:
        raise errors.ConfigurationError(
            f"connector {name!r} does not keep the connector contract: " + "; ".join(problems),
            connector=name, problems=problems)


def load(configured: Mapping[str, Mapping[str, Any]],
         names: Iterable[str] | None = None) -> dict[str, base.Connector]:
    """The connectors ``names`` (default: every configured one), made from their options.

    Raises:
        ConfigurationError: a name is not configured, or a connector cannot be made: a
            startup failure, the process stops.
    """
    wanted = list(configured) if names is None else list(names)
    missing = [n for n in wanted if n not in configured]
    if missing:
        raise errors.ConfigurationError(
            f"connectors not configured: {missing} (AGENTLEDGER_CONNECTORS names "
            f"{sorted(configured)})", missing=missing)
    return {name: make(name, configured[name]) for name in wanted}
