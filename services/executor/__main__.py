"""python -m agentledger.services.executor"""

from __future__ import annotations

import logging

import uvloop

from agentledger import settings, telemetry
from agentledger.services.executor.app import create_app

if __name__ == "__main__":
    # Never the packaged (demo) configuration by accident (issue 38): one line, exit 1.
    settings.require_configuration("executor", allowlist=True, policies=True, connectors=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    telemetry.setup("agentledger-executor")
    uvloop.run(create_app().run())  # uvloop: a cheaper event loop (issue 20 §5)
