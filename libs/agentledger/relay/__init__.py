"""The relay: committed outbox rows to Kafka through PostgreSQL logical replication.

Modules, one concept each: ``pgoutput`` decodes the replication protocol, ``routing``
maps an outbox row to a Kafka record (Debezium Outbox Event Router semantics),
``checkpoint`` decides which LSN may be confirmed, ``publisher`` owns the idempotent
producer, ``repository`` the database, ``topics`` the destination topics, ``metrics`` the
OpenTelemetry instruments, and ``stream`` runs the loop. Start with :class:`stream.Relay`.
"""
