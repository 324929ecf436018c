"""``python -m agentledger.services.relay``: stream the outbox to Kafka."""

from __future__ import annotations

import sys

from agentledger.services.relay import app

if __name__ == "__main__":
    sys.exit(app.main())
