"""python -m agentledger.services.ingress"""

from __future__ import annotations

import logging
import sys

import uvicorn

from agentledger import telemetry
from agentledger.services.ingress.app import create_app
from agentledger.services.ingress.settings import IngressSettings

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Ingress writes its own W3C child headers (intake.trace_headers); FastStream's middleware
    # would replace them with a new root trace, so only the SDK is set up here.
    telemetry.setup("agentledger-ingress")
    cfg = IngressSettings.model_validate({})
    # Access logs are unstructured and carry query strings; handlers log events instead.
    uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_config=None,
                access_log=False, lifespan="on")
