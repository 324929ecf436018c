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
from typing import Any, cast
from uuid import UUID

from agentledger import errors
from agentledger.connectors import base
from agentledger.resources import Resolver, Resource, not_found

GROUP = "agentledger.connectors"
# What else a connector's distribution may offer, under the connector's name: admission's
# check of a target (R1.4) and the planner's read path. Their factories take the options
# and the read-scoped tokens {tenant id: token}.
RESOLVERS = "agentledger.resolvers"
RETRIEVERS = "agentledger.retrievers"
Factory = Callable[[Mapping[str, Any]], base.Connector]
# The keys of a connector's options naming a factory directly ("module:attribute").
FACTORY_KEY = "factory"
_FACTORY_KEYS = {GROUP: FACTORY_KEY, RESOLVERS: "resolver_factory",
                 RETRIEVERS: "retriever_factory"}
_KINDS = {GROUP: "connector", RESOLVERS: "resolver", RETRIEVERS: "retriever"}


def installed(group: str = GROUP) -> dict[str, EntryPoint]:
    """The entry points of ``group`` in every installed distribution, by connector name."""
    return {ep.name: ep for ep in entry_points(group=group)}


def url_option(name: str, options: Mapping[str, Any]) -> str:
    """The ``url`` option of connector ``name`` (http or https).

    Raises:
        ConfigurationError: absent or not an http(s) URL.
    """
    url = options.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise errors.ConfigurationError(f"connector {name!r} needs option 'url' (http[s]://…)",
                                        connector=name, url=url)
    return url


def defaults(crm_url: str) -> dict[str, dict[str, Any]]:
    """The demo's deployment: the CRM and billing connectors, both on the CRM stand-in."""
    return {"crm": {"url": crm_url}, "billing": {"url": crm_url}}


def configured(options: Mapping[str, Mapping[str, Any]] | None,
               crm_url: str) -> Mapping[str, Mapping[str, Any]]:
    """The deployment's connectors: ``AGENTLEDGER_CONNECTORS`` when set, else the demo's."""
    return options if options is not None else defaults(crm_url)


def factory(name: str, options: Mapping[str, Any], group: str = GROUP) -> Any:
    """The factory of connector ``name`` in ``group``: from its options (``factory``,
    ``resolver_factory``, ``retriever_factory``), else its entry point.

    Raises:
        ConfigurationError: no such entry point, or the reference does not import.
    """
    key, kind = _FACTORY_KEYS[group], _KINDS[group]
    reference = options.get(key)
    try:
        if reference is not None:
            if not isinstance(reference, str) or ":" not in reference:
                raise errors.ConfigurationError(
                    f"connector {name!r}: {key} must be 'module:attribute'",
                    connector=name, factory=reference)
            module, _, attribute = reference.partition(":")
            found: Any = importlib.import_module(module)
            for part in attribute.split("."):
                found = getattr(found, part)
        else:
            point = installed(group).get(name)
            if point is None:
                raise errors.ConfigurationError(
                    f"no {kind} {name!r} is installed (entry point group {group!r}) and "
                    f"its options name no {key!r}", connector=name,
                    installed=sorted(installed(group)))
            found = point.load()
    except (ImportError, AttributeError) as exc:
        raise errors.ConfigurationError(f"{kind} {name!r} cannot be imported: {exc}",
                                        connector=name) from exc
    if not callable(found):
        raise errors.ConfigurationError(f"{kind} {name!r}: its factory is not callable",
                                        connector=name)
    return found


def make(name: str, options: Mapping[str, Any]) -> base.Connector:
    """One connector, made by its factory from ``options`` and checked against the contract.

    Raises:
        ConfigurationError: it cannot be found or made, or what was made is not a connector
            named ``name``.
    """
    make_one = factory(name, options)
    own = _own(options)
    try:
        connector = make_one(own)
    except errors.AgentLedgerError:
        raise
    except Exception as exc:  # a third-party factory: any failure is a configuration error
        raise errors.ConfigurationError(f"connector {name!r} could not be made: {exc}",
                                        connector=name) from exc
    check(name, connector)
    return cast(base.Connector, connector)


def retargeted(options: Mapping[str, Any], *, http_url: str, smtp_host: str,
               smtp_port: int) -> dict[str, Any]:
    """``options`` pointed elsewhere: every option that is an http(s) URL becomes ``http_url``,
    ``smtp_host`` and ``smtp_port`` the given ones (the conformance kit's hostile stand-ins)."""
    found = dict(options)
    for key, value in options.items():
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            found[key] = http_url
    if "smtp_host" in found:
        found["smtp_host"], found["smtp_port"] = smtp_host, smtp_port
    return found


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
    else:
        if contract.lookup and not inspect.iscoroutinefunction(getattr(connector, "lookup",
                                                                       None)):
            problems.append("its contract declares lookup, but it has no async lookup()")
        if contract.fencing and not inspect.iscoroutinefunction(getattr(connector, "fence",
                                                                        None)):
            # A take-over must be able to fence a stalled worker out before deciding (issue 37).
            problems.append("its contract declares fencing, but it has no async fence()")
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


def _own(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a factory is given: all but the factory references."""
    return {k: v for k, v in options.items() if k not in _FACTORY_KEYS.values()}


def _reader(group: str, name: str, options: Mapping[str, Any],
            read_tokens: Mapping[str, str]) -> Any:
    make_one = factory(name, options, group)
    try:
        return make_one(_own(options), read_tokens)
    except errors.AgentLedgerError:
        raise
    except Exception as exc:  # a third-party factory: any failure is a configuration error
        raise errors.ConfigurationError(
            f"{_KINDS[group]} {name!r} could not be made: {exc}", connector=name) from exc


def resolver(configured: Mapping[str, Mapping[str, Any]],
             read_tokens: Mapping[str, Mapping[str, str]]) -> RoutingResolver:
    """Admission's resolver: each configured connector's own, chosen by the action's connector.

    Every configured connector must offer one: a target that cannot be checked (R1.4) is not
    admitted, so a deployment without a resolver for a connector does not start.

    Raises:
        ConfigurationError: a connector without a resolver, or one that cannot be made.
    """
    return RoutingResolver({
        name: _reader(RESOLVERS, name, options, read_tokens.get(name, {}))
        for name, options in configured.items()})


def retriever(name: str, configured: Mapping[str, Mapping[str, Any]],
              read_tokens: Mapping[str, str]) -> Any:
    """The planner's read path: connector ``name``'s retriever.

    Raises:
        ConfigurationError: ``name`` is not configured or offers no retriever.
    """
    if name not in configured:
        raise errors.ConfigurationError(f"the planner reads through connector {name!r}, "
                                        "which is not configured", connector=name)
    return _reader(RETRIEVERS, name, configured[name], read_tokens)


def read_tokens(configured: Mapping[str, Mapping[str, Any]],
                per_connector: Mapping[str, Mapping[str, str]] | None,
                legacy: Mapping[str, str]) -> dict[str, Mapping[str, str]]:
    """Read-scoped tokens per connector: as configured, else the one CRM token map for every
    connector (the demo's CRM stand-in serves both of its connectors)."""
    if per_connector is not None:
        return dict(per_connector)
    return {name: legacy for name in configured}


class RoutingResolver:
    """Resolves each target with the resolver of the action's connector."""

    def __init__(self, by_connector: Mapping[str, Resolver]) -> None:
        self.by_connector = dict(by_connector)

    async def resolve(self, tenant_id: UUID, connector: str, resource_id: str) -> Resource:
        found = self.by_connector.get(connector)
        if found is None:  # not configured here: no target of it exists for admission
            raise not_found(resource_id)
        return await found.resolve(tenant_id, connector, resource_id)

    async def aclose(self) -> None:
        for found in self.by_connector.values():
            close = getattr(found, "aclose", None)
            if close is not None:
                await close()
