"""The operator's configuration of the adoption stories (6-8): the e-mail connector of the
outside distribution agentledger-email with its allowlist entry and policy, Mailpit to send
to, and the CRM's note API declared for agentledger-http.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agentledger import settings
from agentledger.connectors import plugins
from demo import stack

# Where the e-mail connector's resolver lets mail go (every seeded customer is @example.com).
EMAIL_DOMAINS = ["example.com"]
EMAIL_SENDER = "assistant@acme.example"
# The demo deployment's id: the e-mail connector derives its Message-ID domain from it, so its
# lookup never finds another deployment's messages (issue 38).
DEPLOYMENT_ID = "agentledger-demo"
# The CRM stand-in's note API declared for agentledger-http (its shipped example).
HTTP_ACTION = "crmhttp.note.create"


def mailpit_binary() -> Path:
    """Mailpit, the real SMTP server the e-mail connector sends to: built by
    deploy/local/mailpit.sh install (make bootstrap), or wherever AGENTLEDGER_MAILPIT_BIN says."""
    found = Path(os.environ.get("AGENTLEDGER_MAILPIT_BIN")
                 or settings.local_dir() / "bin" / "mailpit")
    if not found.is_file():
        raise stack.DemoError(f"Mailpit is missing ({found}): the e-mail story sends to it",
                              "make bootstrap (or: bash deploy/local/mailpit.sh install; "
                              "it needs Go)")
    return found


def operator_config(where: Path) -> dict[str, str]:
    """The operator's configuration for the e-mail connector: the packaged allowlist and
    policies plus what the agentledger-email distribution ships (its allowlist entry and
    ``30_email.cedar``), as AGENTLEDGER_ALLOWLIST and AGENTLEDGER_POLICY_DIR."""
    from importlib import resources

    from agentledger.policy import allowlist, cedar

    if "email" not in plugins.installed() or "email" not in plugins.installed(
            plugins.RESOLVERS):
        raise stack.DemoError("the e-mail connector (entry point 'email') is not installed",
                              "make bootstrap installs libs/agentledger-email into .venv")
    package = resources.files("agentledger_email")
    rules = json.loads(allowlist.DEFAULT_PATH.read_text())
    rules["actions"] += json.loads(package.joinpath("allowlist.json").read_text())["actions"]
    where.mkdir(parents=True, exist_ok=True)
    (where / "allowlist.json").write_text(json.dumps(rules, indent=2))
    shutil.rmtree(where / "policies", ignore_errors=True)
    shutil.copytree(cedar.DEFAULT_DIR, where / "policies")
    (where / "policies" / "30_email.cedar").write_text(
        package.joinpath("policies", "30_email.cedar").read_text())
    # The declarative HTTP connector's action: the CRM's note API, declared (no code).
    note = next(a for a in rules["actions"] if a["name"] == "crm.note.create")
    rules["actions"].append({**note, "name": HTTP_ACTION, "connector": "crmhttp",
                             "description": "A note, through the declared REST API."})
    (where / "allowlist.json").write_text(json.dumps(rules, indent=2))
    return {"AGENTLEDGER_ALLOWLIST": str(where / "allowlist.json"),
            "AGENTLEDGER_POLICY_DIR": str(where / "policies")}


def http_declaration(crm_url: str) -> dict[str, Any]:
    """The CRM's note API declared for agentledger-http: the example declaration the
    distribution ships, read as an operator would copy it (configuration; no import)."""
    from importlib import resources

    if "http" not in plugins.installed():
        raise stack.DemoError("the declarative HTTP connector is not installed",
                              "make bootstrap installs libs/agentledger-http into .venv")
    text = resources.files("agentledger_http").joinpath("examples", "crm_notes.json").read_text()
    found: dict[str, Any] = json.loads(text.replace("{crm_url}", crm_url))
    return found
