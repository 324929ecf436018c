"""Connectors are found by name: entry points of installed distributions, or a factory named
in the configuration — and what a factory makes is checked before a service relies on it."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from agentledger import errors, settings
from agentledger.connectors import crm, plugins
from agentledger.planning import retrieval
from agentledger.resources import crm as crm_resources

PACKAGE = '''
from agentledger.connectors import Applied, Call, Contract, InDoubt

class Echo:
    actions = frozenset({"echo.say"})
    contract = Contract("replay_safe", call_timeout_s=3.0)
    scopes = frozenset({"write"})

    def __init__(self, name, options):
        self.name, self.options = name, dict(options)

    async def execute(self, call: Call, token: str):
        return Applied(receipt=f"echo:{call.operation_id}")

    async def lookup(self, call: Call, token: str):
        return InDoubt("no lookup")

    async def aclose(self):
        pass

def make(options):
    return Echo("acme", options)

def make_other(options):
    return Echo("other", options)

def misnamed(options):
    return Echo("not-acme", options)

class Broken:
    name = "broken"

def broken(options):
    return Broken()

def failing(options):
    raise RuntimeError("the API key is missing")

class Directory:
    def __init__(self, options, read_tokens):
        self.options, self.read_tokens, self.closed = dict(options), dict(read_tokens), False

    async def resolve(self, tenant_id, connector, resource_id):
        from agentledger.resources import Resource, not_found
        if resource_id != "known":
            raise not_found(resource_id)
        return Resource(connector, resource_id, "7")

    async def aclose(self):
        self.closed = True
'''


@pytest.fixture
def distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution installed the way pip leaves one: a package and its dist-info with an
    entry point in group ``agentledger.connectors``, on the import path."""
    (tmp_path / "acme_connector").mkdir()
    (tmp_path / "acme_connector" / "__init__.py").write_text(textwrap.dedent(PACKAGE))
    info = tmp_path / "acme_connector-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-connector\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[agentledger.connectors]\nacme = acme_connector:make\nbroken = acme_connector:broken\n"
        "failing = acme_connector:failing\n\n"
        "[agentledger.resolvers]\nacme = acme_connector:Directory\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path
    sys.modules.pop("acme_connector", None)


def test_an_installed_distributions_connector_is_found_by_its_entry_point(
    distribution: Path,
) -> None:
    assert {"acme", "crm", "billing"} <= set(plugins.installed())
    made = plugins.load({"acme": {"region": "eu"}})
    assert list(made) == ["acme"]
    assert made["acme"].name == "acme" and made["acme"].options == {"region": "eu"}


@pytest.mark.parametrize("name,dist", [("email", "agentledger-email"),
                                       ("http", "agentledger-http")])
def test_the_outside_connectors_are_installed_distributions_found_by_entry_point(
    name: str, dist: str,
) -> None:
    for group in (plugins.GROUP, plugins.RESOLVERS):
        point = plugins.installed(group)[name]
        assert point.dist is not None and point.dist.name == dist
        assert point.value.startswith(f"{dist.replace('-', '_')}:")


def test_the_email_connector_is_made_from_its_own_distribution() -> None:
    made = plugins.load({"email": {"smtp_host": "127.0.0.1", "smtp_port": 25,
                                   "sender": "a@acme.test", "lookup_url": "http://127.0.0.1:1",
                                   "deployment_id": "unit"}})
    assert type(made["email"]).__module__ == "agentledger_email"
    assert made["email"].contract.idempotency == "none" and made["email"].contract.lookup


def test_a_factory_named_in_the_configuration_needs_no_entry_point(distribution: Path) -> None:
    made = plugins.load({"other": {"factory": "acme_connector:make_other", "x": 1}})
    assert made["other"].options == {"x": 1}  # the factory reference is not an option


def test_the_demo_connectors_are_plugins_like_any_other() -> None:
    found = plugins.installed()
    assert found["crm"].value == "agentledger.connectors.crm:crm"
    assert found["billing"].value == "agentledger.connectors.crm:billing"
    made = plugins.load(plugins.defaults("http://127.0.0.1:8090"), ["billing"])
    assert isinstance(made["billing"], crm.BillingConnector)


@pytest.mark.parametrize("options,says", [
    ({"nowhere": {}}, "no connector 'nowhere' is installed"),
    ({"acme": {"factory": "acme_connector"}}, "factory must be 'module:attribute'"),
    ({"acme": {"factory": "acme_connector:absent"}}, "cannot be imported"),
    ({"acme": {"factory": "no_such_module:make"}}, "cannot be imported"),
    ({"acme": {"factory": "acme_connector:misnamed"}}, "its name is 'not-acme', not 'acme'"),
    ({"broken": {}}, "no async execute()"),
    ({"failing": {}}, "could not be made: the API key is missing"),
    ({"crm": {"url": "ftp://x"}}, "needs option 'url'"),
])
def test_a_connector_that_cannot_be_used_is_a_configuration_error(
    distribution: Path, options: dict[str, dict[str, object]], says: str,
) -> None:
    with pytest.raises(errors.ConfigurationError) as raised:
        plugins.load(options)
    assert says in raised.value.message
    assert not raised.value.retryable


async def test_admission_resolves_each_target_with_its_connectors_resolver(
    distribution: Path,
) -> None:
    tenant = uuid.uuid4()
    configured = {"acme": {"region": "eu"}, **plugins.defaults("http://127.0.0.1:8090")}
    tokens = plugins.read_tokens(configured, None, {str(tenant): "read-token"})
    routed = plugins.resolver(configured, tokens)
    acme = routed.by_connector["acme"]
    assert (acme.options, acme.read_tokens) == ({"region": "eu"}, {str(tenant): "read-token"})
    assert isinstance(routed.by_connector["billing"], crm_resources.CrmResolver)
    assert (await routed.resolve(tenant, "acme", "known")).revision == "7"
    with pytest.raises(errors.ResourceNotFound):
        await routed.resolve(tenant, "acme", "unknown")
    with pytest.raises(errors.ResourceNotFound):  # a connector this deployment does not use
        await routed.resolve(tenant, "mailer", "known")
    await routed.aclose()
    assert acme.closed


def test_a_connector_without_a_resolver_keeps_admission_from_starting(
    distribution: Path,
) -> None:
    with pytest.raises(errors.ConfigurationError, match="no resolver 'other' is installed"):
        plugins.resolver({"other": {"factory": "acme_connector:make_other"}}, {})
    made = plugins.resolver({"other": {"resolver_factory": "acme_connector:Directory"}}, {})
    assert set(made.by_connector) == {"other"}


def test_the_planner_reads_through_the_configured_connectors_retriever() -> None:
    configured = plugins.defaults("http://127.0.0.1:8090")
    found = plugins.retriever("crm", configured, {})
    assert isinstance(found, retrieval.CrmRetriever)
    with pytest.raises(errors.ConfigurationError, match="not configured"):
        plugins.retriever("tickets", configured, {})
    with pytest.raises(errors.ConfigurationError, match="no retriever 'billing'"):
        plugins.retriever("billing", configured, {})


def test_a_name_that_is_not_configured_is_refused() -> None:
    with pytest.raises(errors.ConfigurationError, match="not configured"):
        plugins.load(plugins.defaults("http://127.0.0.1:8090"), ["mailer"])


def test_the_connectors_setting_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentledger.services.executor.settings import ExecutorSettings

    monkeypatch.setenv("AGENTLEDGER_CONNECTORS", '{"acme": {"region": "eu"}}')
    cfg = ExecutorSettings.model_validate({"AGENTLEDGER_DATABASE_URL": "postgresql://x/y",
                                           "AGENTLEDGER_KAFKA_BOOTSTRAP": "k:1",
                                           "AGENTLEDGER_MASTER_KEY": "a" * 44})
    assert plugins.configured(cfg.connectors, cfg.crm_url) == {"acme": {"region": "eu"}}
    monkeypatch.delenv("AGENTLEDGER_CONNECTORS")
    unset = ExecutorSettings.model_validate({"AGENTLEDGER_DATABASE_URL": "postgresql://x/y",
                                             "AGENTLEDGER_KAFKA_BOOTSTRAP": "k:1",
                                             "AGENTLEDGER_MASTER_KEY": "a" * 44})
    assert set(plugins.configured(unset.connectors, unset.crm_url)) == {"crm", "billing"}


# Modules of the connector SDK itself; any other agentledger.connectors.* is a connector.
SDK = {"agentledger.connectors", "agentledger.connectors.base", "agentledger.connectors.plugins",
       "agentledger.connectors.boundary",
       "agentledger.connectors.conformance", "agentledger.connectors.pytest_plugin"}
# Connectors distributed outside the library, by their import names.
OUTSIDE = {"agentledger_email", "agentledger_http"}
# Resolvers and retrievers offered as plugins outside the connectors package.
PLUGIN_MODULES = {"agentledger.resources.crm", "agentledger.planning.retrieval.CrmRetriever"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_service_or_library_module_imports_a_connector() -> None:
    root = settings.REPO_ROOT
    sources = [p for base in (root / "services", root / "libs" / "agentledger")
               for p in base.rglob("*.py")
               if "connectors" not in p.relative_to(root).parts
               # the test kit drives the demo's CRM like the tests do; the runtime never does
               and "testing" not in p.relative_to(root).parts
               and p != root / "libs" / "agentledger" / "resources" / "crm.py"]  # plugins
    assert len(sources) > 100  # the walk found the code
    offenders = {
        str(p.relative_to(root)): sorted(n for n in _imports(p)
                                         if (n.startswith("agentledger.connectors.")
                                             and n not in SDK) or n in PLUGIN_MODULES
                                         or n.split(".")[0] in OUTSIDE)
        for p in sources}
    assert {p: n for p, n in offenders.items() if n} == {}
