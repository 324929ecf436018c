"""python -m agentledger.services.executor"""

from __future__ import annotations

import asyncio
import logging

from agentledger import telemetry
from agentledger.services.executor.app import create_app

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    telemetry.setup("agentledger-executor")
    asyncio.run(create_app().run())
