-- Evidence an auditor can verify offline (issue 43): a tamper-evident log per tenant over
-- audit_event, shaped like a transparency log (RFC 6962 / RFC 9162, Trillian, Sigstore Rekor).
--
-- * Every audit row gets its RFC 6962 leaf hash, SHA-256(0x00 || RFC 8785 canonical form of the
--   event), computed by the statement that writes it (the audit copy trigger): no extra
--   statement, no lock, no row anybody else writes. Appends stay as concurrent as before.
-- * A separate notary process (agentledger.evidence.notary) sequences each tenant's leaves in
--   `seq` order into audit_log (position -> leaf), builds the Merkle tree and signs a checkpoint
--   (tenant, tree size, root hash, time, key id) with an Ed25519 key held in a file that no
--   database role can read. Checkpoints are stored here and published on the audit topic.
-- * Retention purges command and approval payloads, never audit rows nor their hashes.

-- ------------------------------------------------------------------ RFC 8785 in SQL
-- A number as ECMAScript's Number.prototype.toString prints its IEEE 754 double (RFC 8785
-- 3.2.2.3): integers of the safe range as digits; anything else through the shortest
-- round-trip digits of the double (PostgreSQL's float8 output) laid out the way ES6 does.
CREATE FUNCTION agentledger_jcs_number(n numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  s text;
  neg boolean;
  mant text;
  e int := 0;
  digits text;
  point int;
  k int;
  p int;  -- the value is 0.digits x 10^p
BEGIN
  IF n = trunc(n) AND abs(n) <= 9007199254740991 THEN
    RETURN n::bigint::text;
  END IF;
  IF abs(n) > 1.7976931348623157e308 OR abs(n) < 2.2250738585072014e-308 THEN
    BEGIN  -- outside the doubles' normal range (rare: a block costs a subtransaction)
      s := n::float8::text;
    EXCEPTION WHEN numeric_value_out_of_range THEN
      -- No IEEE 754 double: RFC 8785 has no form for it (the verifiers refuse the row, a
      -- false alarm); the write it belongs to must not fail for it.
      RETURN n::text;
    END;
  ELSE
    s := n::float8::text;                     -- shortest round-trip digits (PostgreSQL >= 12)
  END IF;
  neg := left(s, 1) = '-';
  IF neg THEN s := substr(s, 2); END IF;
  IF position('e' IN s) > 0 THEN
    mant := split_part(s, 'e', 1);
    e := split_part(s, 'e', 2)::int;
  ELSE
    mant := s;
  END IF;
  point := position('.' IN mant);
  IF point = 0 THEN
    digits := mant; p := length(mant) + e;
  ELSE
    digits := replace(mant, '.', ''); p := point - 1 + e;
  END IF;
  -- strip leading zeros (each one moves the point), then trailing zeros
  WHILE length(digits) > 1 AND left(digits, 1) = '0' LOOP
    digits := substr(digits, 2); p := p - 1;
  END LOOP;
  digits := rtrim(digits, '0');
  IF digits = '' THEN RETURN '0'; END IF;
  k := length(digits);
  IF k <= p AND p <= 21 THEN
    s := digits || repeat('0', p - k);
  ELSIF 0 < p AND p <= 21 THEN
    s := left(digits, p) || '.' || substr(digits, p + 1);
  ELSIF -6 < p AND p <= 0 THEN
    s := '0.' || repeat('0', -p) || digits;
  ELSE
    s := left(digits, 1) || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
         || 'e' || CASE WHEN p - 1 >= 0 THEN '+' ELSE '-' END || abs(p - 1)::text;
  END IF;
  RETURN CASE WHEN neg THEN '-' || s ELSE s END;
END $$;

-- The RFC 8785 (JCS) canonical text of a jsonb value. Strings are escaped as JSON.stringify
-- does (PostgreSQL's JSON escaping is the same: \b \f \n \r \t \" \\ and \u00xx below 0x20);
-- object members are sorted by code point, which is RFC 8785's UTF-16 order for every key
-- that does not mix characters above U+FFFF with characters U+E000..U+FFFF.
-- No SET search_path on these three (a SET makes every call save and restore settings, and
-- the recursion calls often): they run no privileged code, and call each other by
-- schema-qualified name. Scalars are written in place (a jsonb string, true, false, null and an integer of at most
-- 15 digits print canonically already); only containers and other numbers recurse:
-- an audit payload is mostly scalars, and a call costs more than the text it makes.
CREATE FUNCTION agentledger_jcs(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
  out text;
BEGIN
  CASE jsonb_typeof(v)
  WHEN 'object' THEN
    SELECT '{' || coalesce(string_agg(
             to_json(key)::text || ':' ||
             CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                    OR (jsonb_typeof(value) = 'number' AND value::text !~ '^-?[0-9]{1,15}$')
                  THEN public.agentledger_jcs(value) ELSE value::text END,
             ',' ORDER BY key COLLATE "C"), '') || '}'
    INTO out FROM jsonb_each(v);
  WHEN 'array' THEN
    SELECT '[' || coalesce(string_agg(
             CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                    OR (jsonb_typeof(value) = 'number' AND value::text !~ '^-?[0-9]{1,15}$')
                  THEN public.agentledger_jcs(value) ELSE value::text END,
             ',' ORDER BY i), '') || ']'
    INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS a (value, i);
  WHEN 'number' THEN
    out := public.agentledger_jcs_number(v::text::numeric);
  ELSE
    out := v::text;  -- a string (jsonb prints it escaped as JSON), true, false, null
  END CASE;
  RETURN out;
END $$;

-- The RFC 6962 leaf hash of one audit event: SHA-256(0x00 || canonical event). The event's
-- canonical form is the JSON object agentledger.evidence.leaf builds in Python the same way.
CREATE FUNCTION agentledger_audit_leaf_hash(
  p_event_id uuid, p_tenant uuid, p_operation uuid, p_type text, p_payload jsonb,
  p_traceparent text, p_recorded_at timestamptz) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT sha256('\x00'::bytea || convert_to(public.agentledger_jcs(jsonb_build_object(
    'v', 1,
    'event_id', p_event_id::text,
    'tenant_id', p_tenant::text,
    'operation_id', p_operation::text,
    'type', p_type,
    'payload', p_payload,
    'traceparent', p_traceparent,
    'recorded_at', to_char(p_recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))),
    'UTF8'))
$$;

ALTER TABLE audit_event ADD COLUMN leaf_hash bytea;
-- Rows written before this migration get theirs now (history as it stands is what the first
-- checkpoint signs); the append-only trigger is set aside for this one statement only.
ALTER TABLE audit_event DISABLE TRIGGER audit_event_append_only;
UPDATE audit_event SET leaf_hash = agentledger_audit_leaf_hash(
  event_id, tenant_id, operation_id, type, payload, traceparent, recorded_at);
ALTER TABLE audit_event ENABLE TRIGGER audit_event_append_only;
ALTER TABLE audit_event ALTER COLUMN leaf_hash SET NOT NULL;
ALTER TABLE audit_event ADD CONSTRAINT audit_event_leaf_hash_size
  CHECK (octet_length(leaf_hash) = 32);
-- The notary reads new rows by `seq` range; seq grows with the heap, so a BRIN index is a few
-- pages and costs the inserts nothing measurable (a btree would cost every insert a leaf).
CREATE INDEX audit_event_seq_brin ON audit_event USING brin (seq);

-- The copy of 0025, with each row's leaf hash: still one statement per writing statement.
-- Checkpoints are published through the outbox on the audit topic but are about the log, not
-- in it: they are not copied (a checkpoint that became a leaf would call for another one).
CREATE FUNCTION agentledger_copy_audit_events_v3() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
BEGIN
  INSERT INTO public.audit_event (event_id, tenant_id, operation_id, type, payload, traceparent,
                                  recorded_at, leaf_hash)
  SELECT n.id, n.tenant_id, n.operation_id, n.type, n.payload, n.traceparent, n.created_at,
         public.agentledger_audit_leaf_hash(n.id, n.tenant_id, n.operation_id, n.type, n.payload,
                                            n.traceparent, n.created_at)
  FROM new_events AS n
  WHERE n.aggregatetype = 'audit' AND n.type <> 'log.checkpoint';
  RETURN NULL;
END $$;
ALTER FUNCTION agentledger_copy_audit_events_v3() OWNER TO agentledger_audit_writer;
REVOKE ALL ON FUNCTION agentledger_copy_audit_events_v3() FROM PUBLIC;

DROP TRIGGER IF EXISTS audit_event_copy_v2 ON event_outbox;
CREATE TRIGGER audit_event_copy_v3 AFTER INSERT ON event_outbox
  REFERENCING NEW TABLE AS new_events
  FOR EACH STATEMENT EXECUTE FUNCTION agentledger_copy_audit_events_v3();
DROP FUNCTION IF EXISTS agentledger_copy_audit_events_v2();

-- ------------------------------------------------------------------ the log and checkpoints
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentledger_notary') THEN
    CREATE ROLE agentledger_notary NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
  END IF;
END $$;

-- Position -> leaf, per tenant: position i is the tenant's i-th audit event in `seq` order.
CREATE TABLE audit_log (
  tenant_id uuid NOT NULL,
  idx bigint NOT NULL CHECK (idx >= 0),
  seq bigint NOT NULL,
  leaf_hash bytea NOT NULL CHECK (octet_length(leaf_hash) = 32),
  PRIMARY KEY (tenant_id, idx)
);

-- A signed tree head. `body` is the exact RFC 8785 text that was signed; `frontier` the roots
-- of the perfect subtrees along the right edge (a compact range), so the next checkpoint
-- appends without rereading the tenant's leaves.
CREATE TABLE audit_checkpoint (
  tenant_id uuid NOT NULL,
  tree_size bigint NOT NULL CHECK (tree_size > 0),
  root_hash bytea NOT NULL CHECK (octet_length(root_hash) = 32),
  last_seq bigint NOT NULL,
  key_id text NOT NULL,
  signed_at timestamptz NOT NULL,
  body text NOT NULL,
  signature bytea NOT NULL CHECK (octet_length(signature) = 64),
  frontier bytea[] NOT NULL,
  PRIMARY KEY (tenant_id, tree_size)
);

-- How far the notary has sequenced, across tenants (one row).
CREATE TABLE audit_notary_cursor (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  last_seq bigint NOT NULL
);
INSERT INTO audit_notary_cursor (last_seq) VALUES (0);

REVOKE ALL ON audit_log, audit_checkpoint, audit_notary_cursor FROM PUBLIC;
-- Nobody changes a sequenced position or a signed checkpoint: history is only appended.
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_log
  FOR EACH STATEMENT EXECUTE FUNCTION agentledger_audit_is_append_only();
CREATE TRIGGER audit_checkpoint_append_only BEFORE UPDATE OR DELETE OR TRUNCATE
  ON audit_checkpoint FOR EACH STATEMENT EXECUTE FUNCTION agentledger_audit_is_append_only();

ALTER TABLE audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_log FORCE ROW LEVEL SECURITY;
ALTER TABLE audit_checkpoint ENABLE ROW LEVEL SECURITY;
ALTER TABLE audit_checkpoint FORCE ROW LEVEL SECURITY;

-- The notary reads every tenant's leaves, appends positions and checkpoints, and publishes
-- checkpoints on the audit topic; it reads no payload table and changes no audit row.
GRANT SELECT (seq, tenant_id, leaf_hash) ON audit_event TO agentledger_notary;
CREATE POLICY notary_reads ON audit_event FOR SELECT TO agentledger_notary USING (true);
GRANT SELECT, INSERT ON audit_log, audit_checkpoint TO agentledger_notary;
CREATE POLICY notary_appends ON audit_log TO agentledger_notary USING (true) WITH CHECK (true);
CREATE POLICY notary_appends ON audit_checkpoint TO agentledger_notary
  USING (true) WITH CHECK (true);
GRANT SELECT, UPDATE ON audit_notary_cursor TO agentledger_notary;
GRANT INSERT ON event_outbox TO agentledger_notary;
CREATE POLICY notary_publishes ON event_outbox FOR INSERT TO agentledger_notary
  WITH CHECK (aggregatetype = 'audit' AND type = 'log.checkpoint' AND operation_id IS NULL);

-- Auditors, `evidence export` and `verify-chain` read one tenant's log and checkpoints.
GRANT SELECT ON audit_log, audit_checkpoint, audit_notary_cursor TO agentledger_auditor;
CREATE POLICY tenant_isolation ON audit_log FOR SELECT TO agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON audit_checkpoint FOR SELECT TO agentledger_auditor
  USING (tenant_id = agentledger_current_tenant());
