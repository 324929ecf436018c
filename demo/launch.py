"""Bring the demo's world up: fresh database and namespace, every service as a real process.

The order matters: the CRM and the fake model first (seeding needs the CRM's admin API),
then the pipeline, whose configuration carries the seeded tenants' CRM tokens.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentledger import identity, logins, migrations, settings
from agentledger.connectors import plugins
from agentledger.contracts import topics
from agentledger.kafka import topics as kafka_topics
from agentledger.testing import keycloak, processes
from agentledger.testing.crm import Crm
from agentledger.testing.polling import wait_until
from demo import adoption, seed, stack

# Small on purpose: the budget scenario runs five steps of one request against three calls.
BUDGET_TOOL_CALLS = 3
# One partition per topic family is plenty for a demo and starts faster on 2 cores; 2 on the
# exec topics keeps two claims of one connector able to run side by side.
PARTITIONS = "2"
# How long one MCP tool call waits for its outcome (AGENTLEDGER_MCP_WAIT_S): a note takes a
# second or two; a call answered `in_progress` would make the story wait for nothing.
MCP_WAIT_S = "20"
# The MCP story's OAuth 2.1 side: Keycloak's realm, the agent client standing for user:alice
# (its service account), and the kid under which the MCP server signs ingress' sessions for
# the callers it verified (never passing their access tokens on).
REALM = "agentledger-demo"
MCP_AGENT = "agent-alice"
MCP_EXCHANGE_KID = "demo-mcp"


@dataclass(frozen=True)
class Options:
    """What a demo run may vary (the test uses its own database, namespace and home)."""

    home: Path = field(default_factory=settings.demo_home)
    database: str = "agentledger_demo"
    prefix: str = "demo"


@dataclass
class World:
    """Everything a scenario needs to reach the running demo; saved as ``home/state.json``."""

    database_url: str
    crm_database_url: str
    bootstrap: str
    namespace: str
    crm_url: str
    crm_admin_token: str
    ingress_url: str
    console_url: str
    model_url: str
    acme: dict[str, Any]
    globex: dict[str, Any]
    tokens: dict[str, str]   # principal → session token (tenant Acme)
    home: str
    operations: dict[str, Any] = field(default_factory=dict)  # scenario → operation ids
    # What an operator's shell sets for `reconcile resolve` and `principals`: the identity
    # provider's keys (to verify the operator's session) and the reconciler's lookup tokens.
    operator_env: dict[str, str] = field(default_factory=dict)
    # The adoption stories' endpoints (empty in a state.json of an older demo): Mailpit's
    # HTTP API and web UI, the SMTP fault proxy's control port, the MCP server.
    mailpit_url: str = ""
    smtp_fault_url: str = ""
    mcp_url: str = ""
    # Keycloak (the MCP server's authorization server), its admin's password, the realm's
    # issuer and the agent of the MCP story (client_id, client_secret, scope, tenant_id,
    # principal). It boots while the first stories play; the MCP story waits for it and
    # seeds the realm (:func:`seed_realm`).
    keycloak_url: str = ""
    keycloak_admin: str = ""
    oauth_issuer: str = ""
    mcp_agent: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str) -> str:
        return self.namespace + name

    @property
    def tenant(self) -> uuid.UUID:
        return uuid.UUID(self.acme["tenant_id"])

    def crm(self) -> Crm:
        return Crm(self.crm_url, self.crm_database_url,
                       Path(self.home) / "logs" / "crm.log", self.crm_admin_token)

    def save(self) -> None:
        path = Path(self.home) / "state.json"
        path.touch(mode=0o600)
        path.write_text(json.dumps(asdict(self), indent=2, default=str))

    @classmethod
    def load(cls, home: Path) -> World:
        return cls(**json.loads((home / "state.json").read_text()))


Step = Callable[[str], None]


def _quiet(text: str) -> None:
    """A step that only the spinner shows (what a run prints stays short)."""


def _tenant_json(t: seed.Tenant) -> dict[str, Any]:
    # Its CRM tokens too: the conformance story writes and looks up as its connectors do.
    return {"tenant_id": str(t.tenant_id), "name": t.name, "customers": t.customers,
            "crm_tokens": dict(t.tokens)}


def prepare(opts: Options, step: Step) -> tuple[str, str, str]:
    """Stack up, previous demo stopped, fresh databases and namespace.

    Returns:
        (ledger URL, CRM URL, namespace)
    """
    if not re.fullmatch(r"[a-z][a-z0-9]{0,30}", opts.prefix):
        raise stack.DemoError(f"namespace {opts.prefix!r} is not lower-case letters and digits",
                              "pass e.g. --namespace demo2")
    common = settings.load()
    if not stack.stack_answers(common.database_url, common.kafka_bootstrap):
        step("starting Kafka and PostgreSQL (the first run also fetches Kafka from Maven "
             "Central and creates the database cluster)")
        stack.ensure_stack(opts.home)
        common = settings.load()
    stopped = stack.stop_all(opts.home)
    if stopped:
        step(f"stopped the previous demo's {len(stopped)} services")
    step("deleting the previous demo's topics")
    stack.delete_topics(common.kafka_bootstrap, f"{opts.prefix}.")
    step(f"recreating databases {opts.database} and {opts.database}_crm")
    try:
        ledger_url = stack.recreate_database(common.database_url, opts.database)
        crm_url = stack.recreate_database(common.database_url, f"{opts.database}_crm")
    except Exception as exc:
        raise stack.DemoError(f"cannot recreate the demo databases: {exc}",
                              "is another session connected to them? `agentledger down` "
                              "stops the demo's services") from exc
    step("migrating the demo ledger")
    asyncio.run(migrations.migrate(ledger_url, common.migrations_dir))
    # A namespace per run: records of an earlier run are never read as this run's.
    return ledger_url, crm_url, f"{opts.prefix}.{secrets.token_hex(3)}."


def _database(login_urls: dict[str, str], service: str) -> dict[str, str]:
    url = login_urls.get(service)
    return {"AGENTLEDGER_DATABASE_URL": url} if url else {}


def launch(opts: Options, step: Step, progress: Step = _quiet) -> World:
    """Start every service and seed the world; the returned world is saved to state.json.

    ``step`` tells what a run does, ``progress`` what it is waiting for (each service)."""
    ledger_url, crm_db, ns = prepare(opts, step)
    common = settings.load()
    bootstrap = common.kafka_bootstrap
    keys = seed.keys(opts.home)
    run_id = ns.rstrip(".").rsplit(".", 1)[1]
    tag = f"{opts.prefix}-{run_id}"
    admin_token = secrets.token_urlsafe(16)
    ports = processes.free_ports({"crm": 8090, "ingress": 8080, "console": 8070, "model": 8099,
                         "mailpit": 8025, "mailpit-smtp": 1025, "smtp-fault": None,
                         "smtp-control": None, "mcp": 8060, "keycloak": None,
                         "keycloak-management": None})
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    mailpit = adoption.mailpit_binary()
    kc_command = _keycloak_command(ports["keycloak"], ports["keycloak-management"])
    kc_password = secrets.token_urlsafe(18)
    oauth_issuer = f"{url['keycloak']}/realms/{REALM}"
    mcp_url = f"{url['mcp']}/mcp"
    exchange_private, exchange_public = identity.generate_keypair("EdDSA")
    # The e-mail connector as an operator adds it: found by its entry point, configured in
    # AGENTLEDGER_CONNECTORS beside the CRM and billing, its allowlist entry and policy added
    # to the packaged ones. Every service reads the same configuration.
    email = {"smtp_host": "127.0.0.1", "smtp_port": ports["smtp-fault"],
             "sender": adoption.EMAIL_SENDER, "lookup_url": url["mailpit"],
             "recipient_domains": adoption.EMAIL_DOMAINS,
             "deployment_id": adoption.DEPLOYMENT_ID}
    base = {"AGENTLEDGER_KAFKA_BOOTSTRAP": bootstrap, "AGENTLEDGER_MASTER_KEY": keys.master_key_b64,
            "AGENTLEDGER_CONNECTORS": json.dumps({
                **plugins.defaults(url["crm"]), "email": email,
                "crmhttp": adoption.http_declaration(url["crm"])}),
            **adoption.operator_config(opts.home / "config")}
    # Every service logs in as its own role, as in production — never as the ledger's owner,
    # whose SET ROLE a RESET ROLE would undo (issue 17). Ingress' login may only ask which
    # request hash an operation holds (its synchronous 409, migration 0021). The MCP server's
    # reads the principal directory and the ledger only (agentledger_auditor).
    login_urls = asyncio.run(logins.ensure(
        ledger_url, ("admission", "executor", "reconciler", "relay", "console", "ingress",
                     "mcp", "notifier")))

    step("starting the CRM stand-in, the fake model, Mailpit (SMTP) and Keycloak")
    shutil.rmtree(opts.home / "mailpit", ignore_errors=True)  # the previous run's messages
    (opts.home / "mailpit").mkdir(parents=True)
    first = [
        processes.start(opts.home, "crm", "agentledger.services.crm", {
            "AGENTLEDGER_CRM_DATABASE_URL": crm_db, "AGENTLEDGER_CRM_PORT": str(ports["crm"]),
            "AGENTLEDGER_CRM_ADMIN_TOKEN": admin_token,
            "AGENTLEDGER_CRM_FAULTS_ENABLED": "true"}),
        processes.start(opts.home, "model", "agentledger.testing.fake_model",
                    {"FAKE_MODEL_PORT": str(ports["model"])}),
        processes.start_command(opts.home, "mailpit", [
            str(mailpit), "--smtp", f"127.0.0.1:{ports['mailpit-smtp']}",
            "--listen", f"127.0.0.1:{ports['mailpit']}",
            "--database", str(opts.home / "mailpit" / "mailpit.db"),
            "--disable-version-check", "--smtp-disable-rdns"], str(mailpit)),
        # The e-mail executor's SMTP path to Mailpit: it can lose one accepted answer.
        processes.start(opts.home, "smtp-fault", "agentledger.testing.smtp_fault", {
            "AGENTLEDGER_DEMO_SMTP_PORT": str(ports["smtp-fault"]),
            "AGENTLEDGER_DEMO_SMTP_UPSTREAM_PORT": str(ports["mailpit-smtp"]),
            "AGENTLEDGER_DEMO_SMTP_CONTROL_PORT": str(ports["smtp-control"])}),
    ]
    # Keycloak boots in ~25-75 s: it starts now, and only the MCP story waits for it.
    # Its marker is an argument of both kc.sh and the JVM kc.sh may exec after a first start.
    processes.start_command(opts.home, "keycloak", kc_command,
                            f"--http-port={ports['keycloak']}", keycloak.environment(kc_password))
    processes.wait_ready(first, {"crm": processes.http_ok(f"{url['crm']}/readyz"),
                             "model": processes.http_ok(f"{url['model']}/healthz"),
                             "mailpit": processes.http_ok(f"{url['mailpit']}/api/v1/messages"),
                             "smtp-fault": processes.http_ok(f"{url['smtp-control']}/healthz")})
    step("seeding tenants Acme and Globex, CRM tokens and principals")
    crm_admin = Crm(url["crm"], crm_db, opts.home / "logs" / "crm.log", admin_token)
    acme, globex = seed.seed(crm_admin, ledger_url)
    read_tokens = json.dumps({str(t.tenant_id): t.tokens["read"] for t in (acme, globex)})
    # Outcome and audit topics exist before anyone waits on them (the relay creates them
    # lazily, and a reader that starts first would not see them).
    kafka_topics.ensure(bootstrap, {ns + topics.OUTCOMES: 1, ns + topics.AUDIT: 1,
                                    ns + topics.ADMISSIONS: 1},
                        replication=common.kafka_replication_factor)
    envelope_keys = json.dumps({seed.ENVELOPE_KID: keys.envelope_public})
    session_keys = json.dumps({seed.SESSION_KID: keys.session_public})
    # Ingress also accepts the sessions the MCP server signs for its OAuth callers.
    ingress_keys = json.dumps({seed.SESSION_KID: keys.session_public,
                               MCP_EXCHANGE_KID: exchange_public})
    slot = re.sub(r"[^a-z0-9_]", "_", tag.lower())[:63]
    group = {n: f"{tag}-{n}" for n in ("admission", "executor-crm", "executor-billing",
                                       "executor-email", "executor-crmhttp", "planner",
                                       "ingress")}
    # SMTP and Mailpit's search API take no credential here, but the executor and the
    # reconciler still hold one per connector and tenant (R1.7) and act for no tenant
    # without one: each tenant gets a random placeholder.
    email_tokens = {str(t.tenant_id): secrets.token_urlsafe(16) for t in (acme, globex)}
    env: dict[str, dict[str, str]] = {
        "relay": {"AGENTLEDGER_RELAY_SLOT": slot, "AGENTLEDGER_RELAY_TOPIC_NAMESPACE": ns,
                  "AGENTLEDGER_RELAY_EXEC_PARTITIONS": PARTITIONS,
                  "AGENTLEDGER_RELAY_AUDIT_PARTITIONS": "1",
                  "AGENTLEDGER_RELAY_OUTCOME_PARTITIONS": "1"},
        "admission": {
            "AGENTLEDGER_ADMISSION_CRM_URL": url["crm"],
            "AGENTLEDGER_ADMISSION_CRM_READ_TOKENS": read_tokens,
            "AGENTLEDGER_ADMISSION_GROUP_ID": group["admission"],
            "AGENTLEDGER_ADMISSION_PROPOSALS_TOPIC": ns + topics.PROPOSALS,
            "AGENTLEDGER_ADMISSION_ADMISSIONS_TOPIC": ns + topics.ADMISSIONS,
            "AGENTLEDGER_ADMISSION_PARTITIONS": PARTITIONS,
            "AGENTLEDGER_ADMISSION_BUDGET_TOOL_CALLS": str(BUDGET_TOOL_CALLS),
            "AGENTLEDGER_ADMISSION_ENVELOPE_KEYS": envelope_keys},
        "reconciler": {
            "AGENTLEDGER_RECONCILER_CRM_URL": url["crm"],
            "AGENTLEDGER_RECONCILER_PERIOD_S": "1",
            "AGENTLEDGER_RECONCILER_LOOKUP_TOKENS": json.dumps(
                {"crm": {str(t.tenant_id): t.tokens["lookup"] for t in (acme, globex)},
                 # No lookup for refunds, but the fence a take-over advances (issue 37).
                 "billing": {str(t.tenant_id): t.tokens["lookup"] for t in (acme, globex)},
                 "crmhttp": {str(t.tenant_id): t.tokens["lookup"] for t in (acme, globex)},
                 "email": email_tokens})},
        "planner": {
            "AGENTLEDGER_PLANNER_ENVELOPE_KEYS": envelope_keys,
            "AGENTLEDGER_PLANNER_CRM_URL": url["crm"],
            "AGENTLEDGER_PLANNER_CRM_READ_TOKENS": read_tokens,
            "AGENTLEDGER_PLANNER_ADAPTER": "openai",
            "AGENTLEDGER_PLANNER_OPENAI_BASE_URL": f"{url['model']}/v1",
            "AGENTLEDGER_PLANNER_OPENAI_MODEL": "gullible-demo-model",
            "AGENTLEDGER_PLANNER_MODEL_TIMEOUT_S": "10",
            "AGENTLEDGER_PLANNER_GROUP_ID": group["planner"],
            "AGENTLEDGER_PLANNER_REQUESTS_TOPIC": ns + topics.REQUESTS,
            "AGENTLEDGER_PLANNER_PROPOSALS_TOPIC": ns + topics.PROPOSALS,
            "AGENTLEDGER_PLANNER_ADMISSIONS_TOPIC": ns + topics.ADMISSIONS,
            "AGENTLEDGER_PLANNER_PARTITIONS": PARTITIONS},
        "ingress": {
            "AGENTLEDGER_INGRESS_PORT": str(ports["ingress"]),
            "AGENTLEDGER_INGRESS_SESSION_KEYS": ingress_keys,
            "AGENTLEDGER_INGRESS_SESSION_ISSUER": seed.SESSION_ISSUER,
            "AGENTLEDGER_INGRESS_SESSION_AUDIENCE": seed.SESSION_AUDIENCE,
            "AGENTLEDGER_INGRESS_ENVELOPE_KEY": keys.envelope_private,
            "AGENTLEDGER_INGRESS_ENVELOPE_KID": seed.ENVELOPE_KID,
            "AGENTLEDGER_INGRESS_REQUESTS_TOPIC": ns + topics.REQUESTS,
            "AGENTLEDGER_INGRESS_PROPOSALS_TOPIC": ns + topics.PROPOSALS,
            "AGENTLEDGER_INGRESS_GATEWAY_PROPOSALS_TOPIC": ns + topics.GATEWAY_PROPOSALS,
            "AGENTLEDGER_INGRESS_GROUP_ID": group["ingress"],
            "AGENTLEDGER_INGRESS_PARTITIONS": PARTITIONS},
        "console": {
            "AGENTLEDGER_CONSOLE_PORT": str(ports["console"]),
            "AGENTLEDGER_CONSOLE_SESSION_KEYS": session_keys,
            "AGENTLEDGER_CONSOLE_SESSION_ISSUER": seed.SESSION_ISSUER,
            "AGENTLEDGER_CONSOLE_SESSION_AUDIENCE": seed.SESSION_AUDIENCE,
            "AGENTLEDGER_CONSOLE_CRM_URL": url["crm"],
            "AGENTLEDGER_CONSOLE_CRM_READ_TOKENS": read_tokens,
            # Plain HTTP on localhost: a Secure cookie would never come back.
            "AGENTLEDGER_CONSOLE_COOKIE_SECURE": "false"},
        # agentledger mcp over streamable HTTP: the allowlisted actions as MCP tools, each
        # call a proposal through ingress. Callers bring Keycloak's access tokens (OAuth 2.1,
        # this server their audience) or the project's session tokens.
        "mcp": {
            "AGENTLEDGER_MCP_TRANSPORT": "http",
            "AGENTLEDGER_MCP_PORT": str(ports["mcp"]),
            "AGENTLEDGER_MCP_INGRESS_URL": url["ingress"],
            "AGENTLEDGER_MCP_CONSOLE_URL": url["console"],
            "AGENTLEDGER_MCP_ADMISSIONS_TOPIC": ns + topics.ADMISSIONS,
            "AGENTLEDGER_MCP_OUTCOMES_TOPIC": ns + topics.OUTCOMES,
            "AGENTLEDGER_MCP_WAIT_S": MCP_WAIT_S,
            "AGENTLEDGER_MCP_SESSION_KEYS": session_keys,
            "AGENTLEDGER_MCP_SESSION_ISSUER": seed.SESSION_ISSUER,
            "AGENTLEDGER_MCP_SESSION_AUDIENCE": seed.SESSION_AUDIENCE,
            "AGENTLEDGER_MCP_RESOURCE_URL": mcp_url,
            "AGENTLEDGER_MCP_OAUTH_ISSUER": oauth_issuer,
            "AGENTLEDGER_MCP_EXCHANGE_KEY": exchange_private,
            "AGENTLEDGER_MCP_EXCHANGE_KID": MCP_EXCHANGE_KID},
    }
    # Approval notifications (issue 42): the demo's approval file routes nothing, so it sends
    # nothing; with a v2 file in AGENTLEDGER_APPROVALS it tells the routed approvers.
    env["notifier"] = {"AGENTLEDGER_NOTIFIER_CONSOLE_URL": url["console"]}
    for connector in ("crm", "billing", "crmhttp"):  # crmhttp: the CRM's API, declared
        env[f"executor-{connector}"] = {
            "AGENTLEDGER_EXECUTOR_CONNECTOR": connector,
            "AGENTLEDGER_EXECUTOR_EXEC_TOPIC": ns + topics.exec_topic(connector),
            "AGENTLEDGER_EXECUTOR_GROUP_ID": group[f"executor-{connector}"],
            "AGENTLEDGER_EXECUTOR_CRM_URL": url["crm"],
            "AGENTLEDGER_EXECUTOR_PARTITIONS": PARTITIONS,
            "AGENTLEDGER_EXECUTOR_WRITE_TOKENS": json.dumps(
                {connector: {str(t.tenant_id): t.tokens["write"] for t in (acme, globex)}})}
    env["executor-email"] = {
        "AGENTLEDGER_EXECUTOR_CONNECTOR": "email",
        "AGENTLEDGER_EXECUTOR_EXEC_TOPIC": ns + topics.exec_topic("email"),
        "AGENTLEDGER_EXECUTOR_GROUP_ID": group["executor-email"],
        "AGENTLEDGER_EXECUTOR_PARTITIONS": PARTITIONS,
        "AGENTLEDGER_EXECUTOR_WRITE_TOKENS": json.dumps({"email": email_tokens})}
    probes = {
        "relay": processes.slot_active(ledger_url, slot),
        "admission": processes.group_has_members(bootstrap, group["admission"]),
        "executor-crm": processes.group_has_members(bootstrap, group["executor-crm"]),
        "executor-billing": processes.group_has_members(bootstrap, group["executor-billing"]),
        "executor-email": processes.group_has_members(bootstrap, group["executor-email"]),
        "executor-crmhttp": processes.group_has_members(bootstrap, group["executor-crmhttp"]),
        "reconciler": processes.log_contains(opts.home / "logs" / "reconciler.log",
                                         "event=reconciler_started"),
        "planner": processes.group_has_members(bootstrap, group["planner"]),
        "ingress": processes.http_ok(f"{url['ingress']}/readyz"),
        "console": processes.http_ok(f"{url['console']}/readyz"),
        "mcp": processes.http_ok(f"{url['mcp']}/healthz"),
        "notifier": processes.log_contains(opts.home / "logs" / "notifier.log",
                                           "event=notifier_started"),
    }
    step(f"starting {len(env)} services: " + ", ".join(env))
    module = {"executor-crm": "executor", "executor-billing": "executor",
              "executor-email": "executor", "executor-crmhttp": "executor"}
    modules = {name: f"agentledger.services.{module.get(name, name)}" for name in env}
    modules["mcp"] = "agentledger.mcp"
    started = [processes.start(opts.home, name, modules[name],
                           {**base, **_database(login_urls, module.get(name, name)), **own})
               for name, own in env.items()]
    processes.wait_ready(started, probes, on_ready=lambda name: progress(f"{name} is ready"))
    tokens = {p: keys.session(acme.tenant_id, p, roles) for p, roles in seed.PRINCIPALS.items()}
    operator_env = {
        "AGENTLEDGER_OPERATOR_SESSION_KEYS": session_keys,
        "AGENTLEDGER_OPERATOR_SESSION_ISSUER": seed.SESSION_ISSUER,
        "AGENTLEDGER_OPERATOR_SESSION_AUDIENCE": seed.SESSION_AUDIENCE,
        "AGENTLEDGER_OPERATOR_CRM_URL": url["crm"],
        "AGENTLEDGER_OPERATOR_LOOKUP_TOKENS":
            env["reconciler"]["AGENTLEDGER_RECONCILER_LOOKUP_TOKENS"],
        # The services' connectors, actions and policies: what `reconcile resolve` looks up
        # with and `check-config` checks.
        **{name: base[name] for name in ("AGENTLEDGER_CONNECTORS", "AGENTLEDGER_ALLOWLIST",
                                         "AGENTLEDGER_POLICY_DIR")}}
    world = World(
        database_url=ledger_url, crm_database_url=crm_db, bootstrap=bootstrap, namespace=ns,
        crm_url=url["crm"], crm_admin_token=admin_token, ingress_url=url["ingress"],
        console_url=url["console"], model_url=url["model"], acme=_tenant_json(acme),
        globex=_tenant_json(globex), tokens=tokens, home=str(opts.home),
        operator_env=operator_env, mailpit_url=url["mailpit"],
        smtp_fault_url=url["smtp-control"], mcp_url=mcp_url, keycloak_url=url["keycloak"],
        keycloak_admin=kc_password, oauth_issuer=oauth_issuer,
        mcp_agent={"client_id": MCP_AGENT, "client_secret": secrets.token_urlsafe(24),
                   "scope": keycloak.TOOLS_SCOPE, "tenant_id": str(acme.tenant_id),
                   "principal": "user:alice"})
    world.save()
    return world


def _keycloak_command(http_port: int, management_port: int) -> list[str]:
    if not keycloak.installed():
        raise stack.DemoError("Keycloak (the MCP story's authorization server) is not installed",
                              "run: bash deploy/local/bootstrap.sh")
    return keycloak.command(http_port, management_port)


def seed_realm(world: World) -> None:
    """Wait for the demo's Keycloak (started by :func:`launch`), then create its realm: one
    confidential client, the MCP story's agent, whose service account is user:alice of Acme.

    Raises:
        stack.DemoError: Keycloak exited or did not answer in time.
        httpx.HTTPStatusError: Keycloak refused the realm.
    """
    home = Path(world.home)

    def up() -> bool:
        running = {name: alive for name, _, alive in processes.recorded(home)}
        if not running.get("keycloak"):
            raise stack.DemoError("Keycloak exited during start-up",
                                  f"read {home / 'logs' / 'keycloak.log'}")
        return keycloak.answers(world.keycloak_url)

    if not wait_until(up, timeout=keycloak.START_TIMEOUT_S, interval=0.5):
        raise stack.DemoError(f"Keycloak did not answer in {keycloak.START_TIMEOUT_S:.0f} s",
                              f"read {home / 'logs' / 'keycloak.log'}")
    a = world.mcp_agent
    agent = keycloak.Agent(a["client_id"], a["tenant_id"], a["principal"],
                           roles=list(seed.PRINCIPALS[a["principal"]]),
                           secret=a["client_secret"])
    keycloak.Keycloak(world.keycloak_url, world.keycloak_admin).realm(REALM, world.mcp_url,
                                                                      [agent])
