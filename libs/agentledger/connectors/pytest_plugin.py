"""The conformance kit as a pytest plugin (entry point ``pytest11``): a connector author's
tests ask for ``connector_conformance`` and assert that their endpoint keeps the contract::

    async def test_my_api_keeps_its_contract(connector_conformance):
        endpoint = conformance.Endpoint(connector=make(...), tenant_id=..., write_token=...,
                                        lookup_token=..., sample=conformance.Sample(...))
        await connector_conformance(endpoint)   # fails naming every broken claim
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agentledger.connectors import conformance


async def _assert_conforms(endpoint: conformance.Endpoint) -> list[conformance.Finding]:
    findings = await conformance.check(endpoint)
    broken = conformance.failed(findings)
    if broken:
        pytest.fail("the endpoint does not keep its declared contract:\n" + "\n".join(
            f"- {f.claim}: {f.detail}" for f in broken), pytrace=False)
    return findings


@pytest.fixture
def connector_conformance() -> Callable[[conformance.Endpoint],
                                        Awaitable[list[conformance.Finding]]]:
    """Check an endpoint against its connector's contract; fails on any broken claim."""
    return _assert_conforms
