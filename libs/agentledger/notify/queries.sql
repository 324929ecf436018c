-- Notifications of pending approvals (issue 42). Loaded by outbox.py; bound parameters only.

-- name: write_notifications --
-- One row per request x recipient x channel x kind, in the caller's transaction; a row
-- already there (the same key) is left as it is.
INSERT INTO approval_notification (idempotency_key, tenant_id, approval_id, kind, group_name,
                                   recipient, channel, address, message, next_attempt_at)
SELECT r.idempotency_key, r.tenant_id, r.approval_id, r.kind, r.group_name, r.recipient,
       r.channel, r.address, r.message, $2
FROM jsonb_to_recordset($1::jsonb) AS r(idempotency_key text, tenant_id uuid, approval_id uuid,
                                        kind text, group_name text, recipient text,
                                        channel text, address text, message jsonb)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: claim --
-- Due pending rows (new, backed off, or a lease that passed: a killed worker's), leased to
-- this worker until $3; each claim counts an attempt. The lease is this claim's own token
-- (worker id / random): replicas sharing a worker id, or one worker claiming a row again after
-- its own lease passed, never settle each other's claims.
WITH due AS (
  SELECT idempotency_key FROM approval_notification
  WHERE state = 'pending' AND next_attempt_at <= $2
  ORDER BY next_attempt_at LIMIT $4
  FOR UPDATE SKIP LOCKED
)
UPDATE approval_notification n
SET lease_owner = $1 || '/' || gen_random_uuid()::text, next_attempt_at = $3, attempts = n.attempts + 1
FROM due WHERE n.idempotency_key = due.idempotency_key
RETURNING n.*, (SELECT r.state FROM approval_request r
                WHERE r.approval_id = n.approval_id) AS request_state;

-- name: mark_sent --
-- The receiver accepted it. Only the lease holder's mark counts; a row another worker took
-- over (this one's lease passed) is marked by that worker, with the same key.
UPDATE approval_notification
SET state = 'sent', sent_at = $3, lease_owner = NULL, last_error = NULL
WHERE idempotency_key = $1 AND lease_owner = $2 AND state = 'pending'
RETURNING idempotency_key;

-- name: back_off --
-- A failed attempt with attempts left: claimable again at $3.
UPDATE approval_notification
SET next_attempt_at = $3, lease_owner = NULL, last_error = $4
WHERE idempotency_key = $1 AND lease_owner = $2 AND state = 'pending'
RETURNING idempotency_key;

-- name: mark_failed --
-- No attempts left, or the receiver refused it for good.
UPDATE approval_notification
SET state = 'failed', lease_owner = NULL, last_error = $3
WHERE idempotency_key = $1 AND lease_owner = $2 AND state = 'pending'
RETURNING *;

-- name: cancel --
-- The request closed before this notice went out: it is not sent.
UPDATE approval_notification
SET state = 'cancelled', lease_owner = NULL, last_error = $3
WHERE idempotency_key = $1 AND lease_owner = $2 AND state = 'pending'
RETURNING idempotency_key;

-- name: for_approval --
-- Every notification of one request (explain, tests).
SELECT * FROM approval_notification WHERE approval_id = $1 ORDER BY created_at, idempotency_key;

-- name: escalation_due --
-- Pending requests of one rule undecided since before $2, not yet escalated, not expired at
-- $3 (the notifier's clock), oldest first.
SELECT * FROM approval_request
WHERE state = 'pending' AND escalated_at IS NULL AND quorum_rule = $1
  AND created_at <= $2 AND expires_at > $3
ORDER BY created_at LIMIT $4;

-- name: escalate --
-- Escalate one request once: only while it is pending and not escalated yet.
UPDATE approval_request SET escalated_at = $3, escalated_to = $4
WHERE tenant_id = $1 AND approval_id = $2 AND state = 'pending' AND escalated_at IS NULL
RETURNING *;

-- name: expired_unnotified --
-- Routed requests expired since $1 whose expiry notifications are not written yet.
SELECT r.* FROM approval_request r
WHERE r.state = 'expired' AND r.quorum_rule = ANY($2::text[]) AND r.decided_at >= $1
  AND NOT EXISTS (SELECT 1 FROM approval_notification n
                  WHERE n.approval_id = r.approval_id AND n.kind = 'expired')
ORDER BY r.decided_at LIMIT $3;
