"""Wiring of the relay process: settings → library relay, signals → graceful stop.

SIGKILL-safe by design: the slot is confirmed only past published and swept rows, so a
killed relay resumes from the slot and republishes at most what was unconfirmed.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
from types import FrameType

from agentledger import errors, telemetry
from agentledger import settings as shared
from agentledger.relay import stream
from agentledger.services.relay import settings

log = logging.getLogger("agentledger.services.relay")


def build() -> stream.Relay:
    """A relay configured from the environment."""
    return stream.Relay(settings.load().relay_options(shared.load()))


def main() -> int:
    """Run until SIGTERM/SIGINT; the exit code is 0 on a clean stop, 2 when an operator must act."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    telemetry.setup("agentledger-relay")
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("event=relay.stopping signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # `kill -USR1` writes every thread's stack to stderr: how to see where a stuck relay is.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    relay = build()
    try:
        relay.run(stop)
    except errors.RelayError as exc:
        log.error("event=relay.refused code=%s reason=%s", exc.code, exc.message)
        return 2
    return 0
