"""agentledger: a crash-safe runtime for AI-agent side effects on Kafka and PostgreSQL.

The public API, for integrators (everything else is the runtime's own and may change):

- ``GatewayClient`` (with ``Submission`` and ``Resolution``): what an agent gateway embeds to
  submit work and learn what happened (docs/architecture.md, "Gateway client").
- ``errors``: the closed error hierarchy; every error has a stable ``code`` and ``retryable``.
- ``contracts``: the versioned messages on the topics (proposals, admissions, outcomes …).
- ``connectors``: the SDK for writing a connector (docs/connectors.md).

The names resolve on first use (PEP 562), so a service importing ``agentledger.ledger`` does
not pay for the client's HTTP and Kafka imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentledger import connectors, contracts, errors
    from agentledger.client import GatewayClient, Resolution, Submission

__version__ = "0.1.0"

__all__ = ["GatewayClient", "Resolution", "Submission", "__version__", "connectors",
           "contracts", "errors"]

_LAZY = {"GatewayClient": "agentledger.client", "Resolution": "agentledger.client",
         "Submission": "agentledger.client"}
_MODULES = frozenset({"connectors", "contracts", "errors"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        return importlib.import_module(f"agentledger.{name}")
    raise AttributeError(f"module 'agentledger' has no attribute {name!r}")
