-- Queries of the relay's repository (agentledger.relay.repository), run with psycopg2:
-- placeholders are psycopg2's bound %(name)s parameters, never interpolated text.

-- name: slot_info --
-- The relay's slot in this database: its plugin, and whether a process streams from it.
SELECT plugin, active, confirmed_flush_lsn::text AS confirmed_flush_lsn
FROM pg_replication_slots
WHERE slot_name = %(slot)s AND database = current_database();

-- name: publication_tables --
-- Tables the publication streams, and whether it publishes inserts.
SELECT p.pubinsert, t.schemaname, t.tablename
FROM pg_publication p
LEFT JOIN pg_publication_tables t ON t.pubname = p.pubname
WHERE p.pubname = %(publication)s;

-- name: snapshot_outbox --
-- Rows committed before the slot existed (run in the slot's exported snapshot), oldest
-- first; rows of one transaction share created_at, and ctid keeps their insertion order.
SELECT source, id, aggregatetype, aggregateid, type, payload, traceparent, tracestate
FROM (
  SELECT 'command_outbox' AS source, id::text, aggregatetype, aggregateid, type,
         payload::text, traceparent, tracestate, created_at, ctid
  FROM command_outbox
  UNION ALL
  SELECT 'event_outbox', id::text, aggregatetype, aggregateid, type, payload::text,
         traceparent, tracestate, created_at, ctid
  FROM event_outbox
) AS pending
ORDER BY created_at, source, ctid;

-- name: stale_outbox --
-- The backstop's scan (issue 18): rows still in the outbox long after the stream should have
-- published and swept them, oldest first, after a keyset cursor (created_at, source, id).
-- The outbox is normally near empty (rows leave it once Kafka acknowledged them), so this
-- reads little; it is run only when the stream has caught up with the WAL.
SELECT source, id, aggregatetype, aggregateid, type, payload, traceparent, tracestate,
       created_at
FROM (
  SELECT 'command_outbox' AS source, id::text, aggregatetype, aggregateid, type,
         payload::text, traceparent, tracestate, created_at
  FROM command_outbox WHERE created_at < now() - make_interval(secs => %(age)s)
  UNION ALL
  SELECT 'event_outbox', id::text, aggregatetype, aggregateid, type, payload::text,
         traceparent, tracestate, created_at
  FROM event_outbox WHERE created_at < now() - make_interval(secs => %(age)s)
) AS stale
WHERE %(after_at)s::timestamptz IS NULL
   OR (created_at, source, id) > (%(after_at)s::timestamptz, %(after_source)s, %(after_id)s)
ORDER BY created_at, source, id
LIMIT %(limit)s;

-- name: sweep_command_outbox --
-- Remove command obligations whose publication Kafka confirmed.
DELETE FROM command_outbox WHERE id = ANY(%(ids)s::uuid[]);

-- name: sweep_event_outbox --
-- Remove audit/outcome events whose publication Kafka confirmed.
DELETE FROM event_outbox WHERE id = ANY(%(ids)s::uuid[]);

-- name: left_command_outbox --
-- After a sweep that deleted fewer rows than it published: which are still there.
SELECT count(*) FROM command_outbox WHERE id = ANY(%(ids)s::uuid[]);

-- name: left_event_outbox --
SELECT count(*) FROM event_outbox WHERE id = ANY(%(ids)s::uuid[]);

-- name: retained_wal --
-- Bytes of WAL the slot keeps on disk: what an idle or stuck relay costs the database.
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
FROM pg_replication_slots
WHERE slot_name = %(slot)s AND database = current_database();

-- name: drop_slot --
-- Drop the slot (operators and tests; a database with a slot cannot be dropped).
SELECT pg_drop_replication_slot(slot_name)
FROM pg_replication_slots
WHERE slot_name = %(slot)s AND database = current_database();
