"""The connector SDK: what a connector is, what a call can come back with, and how the
services find connectors by name.

A connector is any object with the :class:`Connector` shape (a name, the actions it performs,
its :class:`Contract`, the scopes it needs, ``execute``, ``lookup`` and ``aclose``), made by a
*factory* that takes the connector's options from the operator's configuration. The services
never import a connector: they ask :mod:`agentledger.connectors.plugins` for one by name, and
it finds the factory through the ``agentledger.connectors`` entry-point group of the
installed distributions (the CRM and billing connectors are found that way too), or through
a ``factory = "module:attribute"`` in the configuration. See docs/connectors.md.
"""

from agentledger.connectors.base import (
    DEADLINE_HEADER,
    Advanced,
    Applied,
    Call,
    Connector,
    Contract,
    Credentials,
    Fenced,
    Fencer,
    FenceResult,
    Idempotency,
    InDoubt,
    Lookup,
    NotFound,
    NotSent,
    PreconditionFailed,
    Refused,
    Result,
    Scope,
)

__all__ = ["DEADLINE_HEADER", "Advanced", "Applied", "Call", "Connector", "Contract",
           "Credentials", "FenceResult", "Fenced", "Fencer", "Idempotency", "InDoubt", "Lookup",
           "NotFound", "NotSent", "PreconditionFailed", "Refused", "Result", "Scope"]
