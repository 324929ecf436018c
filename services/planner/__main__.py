"""python -m agentledger.services.planner"""

from __future__ import annotations

import logging

import uvloop

from agentledger import settings, telemetry
from agentledger.services.planner.app import create_app

if __name__ == "__main__":
    # Never the packaged (demo) configuration by accident (issue 38): one line, exit 1.
    settings.require_configuration("planner", allowlist=True, connectors=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    telemetry.setup("agentledger-planner")
    uvloop.run(create_app().run())  # uvloop: a cheaper event loop (issue 20 §5)
