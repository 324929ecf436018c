-- Queries of the CRM stand-in. Every value is a bound parameter; tenant_id comes from the
-- caller's token, so each tenant-scoped query filters on it.

-- name: lock_schema --
-- Serialize schema application between processes starting at the same time.
SELECT pg_advisory_xact_lock(hashtext('agentledger.crm.schema'));

-- name: ping --
-- Readiness: the database answers a real query.
SELECT 1;

-- name: find_token --
-- The tenant and scopes of a presented token, by its SHA-256.
SELECT tenant_id, scopes FROM crm_api_token WHERE token_sha256 = $1;

-- name: insert_token --
-- Register a token (only its hash) for a tenant with the given scopes.
INSERT INTO crm_api_token (token_sha256, tenant_id, scopes, label) VALUES ($1, $2, $3, $4);

-- name: upsert_customer --
-- Admin seeding: create a customer or overwrite its fields and bump its revision.
INSERT INTO crm_customer (tenant_id, customer_id, display_name, email, phone,
                          address_line1, address_line2, city, postal_code, country)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id, customer_id) DO UPDATE
SET display_name = EXCLUDED.display_name, email = EXCLUDED.email, phone = EXCLUDED.phone,
    address_line1 = EXCLUDED.address_line1, address_line2 = EXCLUDED.address_line2,
    city = EXCLUDED.city, postal_code = EXCLUDED.postal_code, country = EXCLUDED.country,
    revision = crm_customer.revision + 1, updated_at = now()
RETURNING *;

-- name: get_customer --
-- One customer of one tenant (another tenant's customer is simply not found).
SELECT * FROM crm_customer WHERE tenant_id = $1 AND customer_id = $2;

-- name: customer_revisions --
-- The revisions of the customers of one tenant among the ids given ($2); absent ids, like
-- another tenant's, are simply not in the answer.
SELECT customer_id, revision FROM crm_customer
WHERE tenant_id = $1 AND customer_id = ANY($2::text[]);

-- name: lock_customer --
-- The customer row, locked so its revision cannot change before this transaction ends.
SELECT * FROM crm_customer WHERE tenant_id = $1 AND customer_id = $2 FOR UPDATE;

-- name: share_customer --
-- The customer row, share-locked: its revision cannot change before this transaction ends,
-- and other writers that do not change it (notes) go on at the same time.
SELECT * FROM crm_customer WHERE tenant_id = $1 AND customer_id = $2 FOR SHARE;

-- name: update_contact --
-- Write the merged contact fields and bump the revision (the row is already locked).
UPDATE crm_customer
SET display_name = $3, email = $4, phone = $5, address_line1 = $6, address_line2 = $7,
    city = $8, postal_code = $9, country = $10, revision = revision + 1, updated_at = now()
WHERE tenant_id = $1 AND customer_id = $2
RETURNING *;

-- name: insert_note --
-- A note on a customer; notes do not change the customer's revision.
INSERT INTO crm_note (note_id, tenant_id, customer_id, body)
VALUES ($1, $2, $3, $4)
RETURNING *;

-- name: insert_refund --
-- A refund: deliberately no key, every call is a new refund.
INSERT INTO crm_refund (refund_id, tenant_id, customer_id, invoice_id, amount_cents, currency,
                        reason)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING *;

-- name: raise_fence --
-- Record a write's fencing token for its key and return the highest one seen. The row lock
-- (taken by the upsert, held to commit) orders concurrent writers of one key; a caller
-- whose token is below the result is stale and rolls back, so the row never moved for it.
INSERT INTO crm_fence (tenant_id, fencing_key, token)
VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, fencing_key) DO UPDATE
SET token = greatest(crm_fence.token, EXCLUDED.token), updated_at = now()
RETURNING token;

-- name: claim_key --
-- Bind a key to this request. Blocks while another transaction holds the same key, then
-- returns no row if that one committed (replay or conflict), or takes over an expired key.
INSERT INTO crm_idempotency (tenant_id, idempotency_key, request_hash, method, path, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
ON CONFLICT (tenant_id, idempotency_key) DO UPDATE
SET request_hash = EXCLUDED.request_hash, method = EXCLUDED.method, path = EXCLUDED.path,
    status_code = NULL, response_headers = NULL, response_body = NULL,
    created_at = now(), expires_at = EXCLUDED.expires_at
WHERE crm_idempotency.expires_at <= now()
RETURNING idempotency_key;

-- name: get_key --
-- The unexpired record of a key within one tenant.
SELECT idempotency_key, request_hash, method, path, status_code, response_headers,
       response_body, created_at, expires_at
FROM crm_idempotency
WHERE tenant_id = $1 AND idempotency_key = $2 AND expires_at > now();

-- name: record_response --
-- Store the exact response of the request that claimed the key.
UPDATE crm_idempotency
SET status_code = $3, response_headers = $4, response_body = $5
WHERE tenant_id = $1 AND idempotency_key = $2;

-- name: purge_expired_keys --
-- Forget keys past their retention window.
DELETE FROM crm_idempotency WHERE expires_at <= now();

-- name: insert_effect --
-- Append one applied mutation to the effect log.
INSERT INTO crm_effect (tenant_id, kind, customer_id, idempotency_key, request_hash)
VALUES ($1, $2, $3, $4, $5);

-- name: list_effects --
-- The effect log of one tenant, oldest first.
SELECT effect_id, tenant_id, kind, customer_id, idempotency_key, request_hash, created_at
FROM crm_effect
WHERE tenant_id = $1
ORDER BY effect_id;

-- name: create_note --
-- A note as ONE statement (the hot write; no BEGIN/COMMIT round trips): raise the fence
-- ($11/$12, if any), find an unexpired earlier use of the key ($6, if any), share-lock the
-- customer and check its revision against If-Match ($13, if any), and only when all pass
-- claim the key WITH the response to replay ($14-$16), insert the note and its effect.
-- The verdict says what happened: stale (a higher fencing token was seen), replay (the key
-- was used: its record is returned), not_found, stale_revision (412), apply. ``applied``
-- false under ``apply`` means a concurrent request claimed the key between this statement's
-- snapshot and its claim: the caller reads the key again. A fence raised by a write that
-- then fails stays raised: a newer generation was seen, whatever became of its request.
WITH fence AS (
  INSERT INTO crm_fence (tenant_id, fencing_key, token)
  SELECT $1, $11::text, $12::bigint WHERE $11::text IS NOT NULL
  ON CONFLICT (tenant_id, fencing_key) DO UPDATE
  SET token = greatest(crm_fence.token, EXCLUDED.token), updated_at = now()
  RETURNING token
), prior AS (
  SELECT idempotency_key, request_hash, method, path, status_code, response_headers,
         response_body, created_at, expires_at
  FROM crm_idempotency
  WHERE tenant_id = $1 AND idempotency_key = $6::text AND expires_at > now()
), customer AS (
  SELECT revision FROM crm_customer WHERE tenant_id = $1 AND customer_id = $2 FOR SHARE
), verdict AS (
  SELECT CASE
    WHEN EXISTS (SELECT 1 FROM fence WHERE token > $12::bigint) THEN 'stale'
    WHEN EXISTS (SELECT 1 FROM prior) THEN 'replay'
    WHEN NOT EXISTS (SELECT 1 FROM customer) THEN 'not_found'
    WHEN $13::int[] IS NOT NULL
         AND NOT EXISTS (SELECT 1 FROM customer WHERE revision = ANY($13::int[]))
      THEN 'stale_revision'
    ELSE 'apply' END AS verdict
), claim AS (
  INSERT INTO crm_idempotency (tenant_id, idempotency_key, request_hash, method, path,
                               status_code, response_headers, response_body, expires_at)
  SELECT $1, $6::text, $7, $8, $9, $16, $14, $15, now() + make_interval(secs => $10)
  FROM verdict WHERE verdict = 'apply' AND $6::text IS NOT NULL
  ON CONFLICT (tenant_id, idempotency_key) DO UPDATE
  SET request_hash = EXCLUDED.request_hash, method = EXCLUDED.method, path = EXCLUDED.path,
      status_code = EXCLUDED.status_code, response_headers = EXCLUDED.response_headers,
      response_body = EXCLUDED.response_body, created_at = now(),
      expires_at = EXCLUDED.expires_at
  WHERE crm_idempotency.expires_at <= now()
  RETURNING idempotency_key
), go AS (
  SELECT 1 FROM verdict
  WHERE verdict = 'apply' AND ($6::text IS NULL OR EXISTS (SELECT 1 FROM claim))
), note AS (
  INSERT INTO crm_note (note_id, tenant_id, customer_id, body, created_at)
  SELECT $3, $1, $2, $4, $5 FROM go
  RETURNING note_id
), effect AS (
  INSERT INTO crm_effect (tenant_id, kind, customer_id, idempotency_key, request_hash)
  SELECT $1, 'note.created', $2, $6::text, $7 FROM go
)
SELECT v.verdict, EXISTS (SELECT 1 FROM note) AS applied, (SELECT token FROM fence) AS highest,
       (SELECT revision FROM customer) AS revision,
       p.idempotency_key, p.request_hash, p.method, p.path, p.status_code,
       p.response_headers, p.response_body, p.created_at, p.expires_at
FROM verdict v LEFT JOIN prior p ON true;
