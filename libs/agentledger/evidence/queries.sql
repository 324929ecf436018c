-- The notary's and the evidence readers' statements (issue 43).

-- name: snapshot --
-- This transaction's snapshot bounds, and the newest audit row it sees past the cursor.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax,
       (SELECT last_seq FROM audit_notary_cursor) AS cursor,
       coalesce((SELECT max(seq) FROM audit_event
                 WHERE seq > (SELECT last_seq FROM audit_notary_cursor)), 0) AS newest;

-- name: try_lock --
SELECT pg_try_advisory_xact_lock($1);

-- name: new_leaves --
-- Leaves past the cursor up to the safe watermark, in seq order.
SELECT tenant_id, seq, leaf_hash FROM audit_event
WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3;

-- name: heads --
-- The newest checkpoint of each tenant named.
SELECT DISTINCT ON (tenant_id) tenant_id, tree_size, root_hash, frontier, last_seq
FROM audit_checkpoint WHERE tenant_id = ANY($1::uuid[])
ORDER BY tenant_id, tree_size DESC;

-- name: append_leaves --
INSERT INTO audit_log (tenant_id, idx, seq, leaf_hash)
SELECT $1, i, s, h FROM unnest($2::bigint[], $3::bigint[], $4::bytea[]) AS u (i, s, h);

-- name: insert_checkpoint --
INSERT INTO audit_checkpoint (tenant_id, tree_size, root_hash, last_seq, key_id, signed_at, body,
                              signature, frontier)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: publish_checkpoint --
-- On the audit topic (the relay publishes it); not copied into audit_event (migration 0050).
INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload)
VALUES ($1::uuid, NULL, 'audit', $1::uuid::text, 'log.checkpoint', $2::jsonb);

-- name: advance_cursor --
UPDATE audit_notary_cursor SET last_seq = $1;

-- name: operation_events --
SELECT event_id, seq, tenant_id, operation_id, type, payload, traceparent, recorded_at, leaf_hash
FROM audit_event WHERE tenant_id = $1 AND operation_id = $2 ORDER BY seq;

-- name: latest_checkpoint --
SELECT tree_size, body, signature FROM audit_checkpoint WHERE tenant_id = $1
ORDER BY tree_size DESC LIMIT 1;

-- name: checkpoints --
SELECT tree_size, root_hash, last_seq, key_id, body, signature FROM audit_checkpoint
WHERE tenant_id = $1 ORDER BY tree_size;

-- name: cursor --
SELECT last_seq FROM audit_notary_cursor;

-- name: log_leaves --
SELECT idx, seq, leaf_hash FROM audit_log WHERE tenant_id = $1 AND idx < $2 ORDER BY idx;

-- name: tenant_events --
-- Every audit row of the tenant up to a seq, in seq order (verify-chain).
SELECT event_id, seq, tenant_id, operation_id, type, payload, traceparent, recorded_at, leaf_hash
FROM audit_event WHERE tenant_id = $1 AND seq <= $2 ORDER BY seq;

-- name: command --
SELECT request_hash, principal_id, action, resource_id, expected_revision, state,
       provider_receipt, payload_purged_at
FROM agent_command WHERE tenant_id = $1 AND operation_id = $2;
