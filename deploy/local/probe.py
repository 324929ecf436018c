"""Readiness probes that need a real answer, not an open port.

Usage: probe.py kafka HOST:PORT[,HOST:PORT...] [BROKERS]
       probe.py kafka-broker HOST:PORT NODE_ID
``kafka`` prints the cluster's identity and exits 0 when it answers a metadata request (with at
least BROKERS registered brokers, default 1). ``kafka-broker`` exits 0 when the broker at
HOST:PORT answers and lists itself, i.e. it is registered and unfenced.
"""

from __future__ import annotations

import sys

from confluent_kafka.admin import AdminClient


def kafka(bootstrap: str, brokers: str = "1") -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 3000})
    md = admin.list_topics(timeout=3)
    cluster = admin.describe_cluster(request_timeout=3).result(timeout=5)
    print(f"kafka cluster={cluster.cluster_id} brokers={len(md.brokers)} controller={cluster.controller.id}")
    return 0 if len(md.brokers) >= int(brokers) else 1


def kafka_broker(address: str, node_id: str) -> int:
    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 3000})
    md = admin.list_topics(timeout=3)
    # The answer comes from the first broker that answers: the one asked, its only bootstrap.
    print(f"kafka broker {node_id} answers; brokers={sorted(md.brokers)}")
    return 0 if int(node_id) in md.brokers and md.orig_broker_id == int(node_id) else 1


if __name__ == "__main__":
    kind, args = sys.argv[1], sys.argv[2:]
    try:
        sys.exit({"kafka": kafka, "kafka-broker": kafka_broker}[kind](*args))
    except Exception as exc:  # a probe reports, it never raises
        print(f"{kind} not ready: {exc}", file=sys.stderr)
        sys.exit(1)
