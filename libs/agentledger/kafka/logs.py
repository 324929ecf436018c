"""Where librdkafka's own log lines go: Python logging, never a raw line on stderr.

Left to itself, librdkafka (under every confluent-kafka client) writes its log lines straight
to stderr from its own threads, as ``%3|1712345678.901|FAIL|rdkafka#producer-1| ...``: in
the middle of a narrated demo, between a service's structured lines, after pytest's summary
when a client outlives its test. Given ``"logger": LIBRDKAFKA`` in its configuration, a
client hands each line to this :class:`logging.Logger` instead (confluent-kafka maps the
syslog level: 3 → ERROR, 4 → WARNING, 5-6 → INFO, 7 → DEBUG), from the thread that polls the
client. So the line lands where the process sends its logs, at the level the process logs
at; a line still queued when the client is destroyed is dropped, never printed.

Every client the library builds passes it (a test checks the calls); ``agentledger`` (the
CLI) keeps these lines off the terminal unless ``--debug``.
"""

from __future__ import annotations

import logging

LIBRDKAFKA = logging.getLogger("agentledger.kafka.librdkafka")

__all__ = ["LIBRDKAFKA"]
