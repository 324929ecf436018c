"""python -m agentledger.services.admission"""

from __future__ import annotations

import logging

import uvloop

from agentledger import errors, settings, telemetry
from agentledger.services.admission.app import create_app

if __name__ == "__main__":
    # Never the packaged (demo) configuration by accident (issue 38): one line, exit 1.
    settings.require_configuration("admission", allowlist=True, policies=True, connectors=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    telemetry.setup("agentledger-admission")
    try:
        uvloop.run(create_app().run())  # uvloop: a cheaper event loop (issue 20 §5)
    # e.g. budgets that do not fit the allowlist, an allowlist whose narrow rule cannot work
    except (errors.ConfigurationError, errors.ValidationFailed) as exc:
        raise SystemExit(f"agentledger admission: {exc.message}") from None
