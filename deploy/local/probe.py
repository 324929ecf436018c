"""Readiness probes that need a real answer, not an open port.

Usage: probe.py kafka HOST:PORT
Prints the broker's identity and exits 0 when the broker answers a metadata request.
"""

from __future__ import annotations

import sys

from confluent_kafka.admin import AdminClient


def kafka(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000})
    md = admin.list_topics(timeout=3)
    cluster = admin.describe_cluster(request_timeout=3).result(timeout=5)
    print(f"kafka cluster={cluster.cluster_id} brokers={len(md.brokers)} controller={cluster.controller.id}")
    return 0


if __name__ == "__main__":
    kind, target = sys.argv[1], sys.argv[2]
    try:
        sys.exit({"kafka": kafka}[kind](target))
    except Exception as exc:  # a probe reports, it never raises
        print(f"{kind} not ready: {exc}", file=sys.stderr)
        sys.exit(1)
