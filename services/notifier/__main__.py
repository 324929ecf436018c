"""python -m agentledger.services.notifier"""

from __future__ import annotations

import logging

import uvloop

from agentledger import errors, settings, telemetry
from agentledger.services.notifier.app import run

if __name__ == "__main__":
    # Never the packaged (demo) configuration by accident (issue 38): one line, exit 1.
    settings.require_configuration("notifier", allowlist=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    telemetry.setup("agentledger-notifier")
    try:
        uvloop.run(run())  # uvloop: a cheaper event loop (issue 20 §5)
    # routing that cannot work: a missing signing secret, an unknown plugin, a bad option
    except (errors.ConfigurationError, errors.ValidationFailed) as exc:
        raise SystemExit(f"agentledger notifier: {exc.message}") from None
