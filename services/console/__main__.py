"""python -m agentledger.services.console"""

from __future__ import annotations

import logging
import sys

import uvicorn

from agentledger import errors, settings
from agentledger.services.console.app import create_app
from agentledger.services.console.settings import ConsoleSettings

if __name__ == "__main__":
    # Never the packaged (demo) configuration by accident (issue 38): one line, exit 1.
    settings.require_configuration("console", allowlist=True, policies=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = ConsoleSettings.model_validate({})
    try:
        app = create_app(cfg)
    # e.g. approval rules or budgets that do not fit the allowlist (issue 42)
    except (errors.ConfigurationError, errors.ValidationFailed) as exc:
        raise SystemExit(f"agentledger console: {exc.message}") from None
    # Access logs are unstructured and carry query strings; handlers log events instead.
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_config=None,
                access_log=False, lifespan="on")
