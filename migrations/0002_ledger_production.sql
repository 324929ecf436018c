-- What production needs on top of the seed schema (SPEC R2-R5, R3.6, R4.5, R8.4):
-- typed command columns instead of a free-form document, an encrypted payload, the claim /
-- fencing columns of the dispatcher, one row per execution attempt, per-tenant data keys,
-- Debezium-compatible outbox columns, an outbox for audit and outcome events, and tenant
-- isolation enforced by row-level security with one least-privilege role per service.

-- ---------------------------------------------------------------- command ledger
ALTER TABLE agent_command DROP CONSTRAINT agent_command_state_check;
ALTER TABLE agent_command ADD CONSTRAINT agent_command_state_check CHECK (state IN (
  'pending', 'dispatching', 'succeeded', 'denied', 'expired', 'unknown',
  'review_required',  -- a failed precondition (If-Match): back to review, never retried blind
  'failed'            -- only set by an operator resolving `unknown`
));

-- The seed's `command` document is replaced by typed columns (what queries and the audit
-- need) and an encrypted payload (R3.6: store only what is needed, encrypted at rest).
ALTER TABLE agent_command DROP COLUMN command;
ALTER TABLE agent_command
  ADD COLUMN principal_id text NOT NULL,
  ADD COLUMN action text NOT NULL,
  ADD COLUMN connector text NOT NULL,
  ADD COLUMN resource_id text NOT NULL,
  ADD COLUMN expected_revision text,
  ADD COLUMN decision_id uuid NOT NULL,
  ADD COLUMN policy_version text NOT NULL,
  ADD COLUMN allowlist_version text NOT NULL,
  ADD COLUMN expires_at timestamptz NOT NULL,
  ADD COLUMN payload_ciphertext bytea,
  ADD COLUMN payload_key_version integer,
  ADD COLUMN payload_purged_at timestamptz,
  ADD COLUMN claim_token uuid,
  ADD COLUMN claimed_by text,
  ADD COLUMN fencing_generation bigint NOT NULL DEFAULT 0,
  ADD COLUMN outcome_reason text,
  ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
  ADD COLUMN dispatched_at timestamptz,
  ADD COLUMN finished_at timestamptz,
  ADD CONSTRAINT agent_command_hash_len CHECK (octet_length(request_hash) = 32),
  -- "At no point succeeded without a receipt."
  ADD CONSTRAINT agent_command_success_has_receipt
    CHECK (state <> 'succeeded' OR provider_receipt IS NOT NULL),
  ADD CONSTRAINT agent_command_claim_complete
    CHECK (state <> 'dispatching' OR (claim_token IS NOT NULL AND lease_until IS NOT NULL)),
  ADD CONSTRAINT agent_command_payload_kept_or_purged
    CHECK ((payload_ciphertext IS NULL) <> (payload_purged_at IS NULL));

CREATE INDEX agent_command_dispatchable ON agent_command (state, lease_until)
  WHERE state IN ('pending', 'dispatching', 'unknown');

-- One row per execution attempt (R5.6): who, which fencing generation, when, what came back.
CREATE TABLE command_attempt (
  attempt_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id uuid NOT NULL,
  operation_id uuid NOT NULL,
  fencing_generation bigint NOT NULL,
  worker_id text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('dispatch', 'lookup', 'resend')),
  started_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  result text CHECK (result IN (
    'succeeded', 'denied', 'expired', 'unknown', 'review_required', 'failed', 'error'
  )),
  detail text,
  traceparent text,
  FOREIGN KEY (tenant_id, operation_id) REFERENCES agent_command (tenant_id, operation_id)
);
CREATE INDEX command_attempt_by_command ON command_attempt (tenant_id, operation_id, started_at);

-- Per-tenant data keys, wrapped by the master key from configuration (R3.6).
CREATE TABLE tenant_data_key (
  tenant_id uuid NOT NULL,
  key_version integer NOT NULL,
  wrapped_key bytea NOT NULL,
  master_key_id text NOT NULL,  -- which master key wrapped it (rotation re-wraps)
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, key_version)
);

-- ---------------------------------------------------------------- outboxes
-- Column names follow Debezium's Outbox Event Router (id, aggregatetype, aggregateid, type,
-- payload) so Kafka Connect can replace our relay. The command outbox keeps the seed's key:
-- one dispatch obligation per command, created only by the first admission.
ALTER TABLE command_outbox
  ADD COLUMN id uuid NOT NULL DEFAULT gen_random_uuid(),
  ADD COLUMN aggregatetype text NOT NULL,  -- the connector: routes to exec.<connector>.v1
  ADD COLUMN aggregateid text NOT NULL,    -- '<tenant_id>:<operation_id>': the Kafka key
  ADD COLUMN type text NOT NULL DEFAULT 'command.admitted',
  ADD COLUMN payload jsonb NOT NULL,       -- tenant id, operation id, type: never the command
  ADD COLUMN traceparent text,             -- W3C context captured at admission (R8.2)
  ADD COLUMN tracestate text,
  ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
  ADD CONSTRAINT command_outbox_id_key UNIQUE (id);

-- Audit and outcome events, many per command, published to audit.events.v1 and
-- agent.outcomes.v1 (keyed by tenant id).
CREATE TABLE event_outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id uuid NOT NULL,
  operation_id uuid,
  aggregatetype text NOT NULL CHECK (aggregatetype IN ('audit', 'outcome')),
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb NOT NULL,
  traceparent text,
  tracestate text,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- The relay streams inserts only; deletes (the sweep after publication) are not events.
CREATE PUBLICATION agentledger_outbox FOR TABLE command_outbox, event_outbox
  WITH (publish = 'insert');

-- ---------------------------------------------------------------- roles (R4.5)
-- Roles are cluster-wide; several databases (tests, staging) share them, so create once.
-- NOLOGIN group roles: deployments grant them to login users (deploy/, `agentledger roles`).
DO $$
DECLARE r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['agentledger_admission', 'agentledger_executor',
                           'agentledger_reconciler', 'agentledger_relay',
                           'agentledger_maintenance', 'agentledger_auditor'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE', r);
    END IF;
  END LOOP;
END $$;
ALTER ROLE agentledger_relay REPLICATION;

REVOKE ALL ON agent_command, command_outbox, event_outbox, command_attempt, tenant_data_key
  FROM PUBLIC;

-- Admission admits: it inserts commands, obligations, events and data keys, and reads back
-- the recorded state for replay detection. It can never change dispatch state.
GRANT SELECT, INSERT ON agent_command, command_outbox, event_outbox, tenant_data_key
  TO agentledger_admission;

-- Executor and reconciler change state columns only: never the payload, hash or command.
GRANT SELECT ON agent_command, tenant_data_key TO agentledger_executor, agentledger_reconciler;
GRANT UPDATE (state, provider_receipt, lease_until, claim_token, claimed_by, fencing_generation,
              outcome_reason, updated_at, dispatched_at, finished_at)
  ON agent_command TO agentledger_executor, agentledger_reconciler;
GRANT SELECT, INSERT, UPDATE ON command_attempt TO agentledger_executor, agentledger_reconciler;
GRANT INSERT ON event_outbox TO agentledger_executor, agentledger_reconciler;

-- The relay replicates, and sweeps rows whose publication Kafka confirmed.
GRANT SELECT, DELETE ON command_outbox, event_outbox TO agentledger_relay;

-- Retention purges payloads of terminal commands; hashes stay for replay detection.
GRANT SELECT ON agent_command TO agentledger_maintenance;
GRANT UPDATE (payload_ciphertext, payload_key_version, payload_purged_at, updated_at)
  ON agent_command TO agentledger_maintenance;

-- Auditors and `explain` read, per tenant.
GRANT SELECT ON agent_command, command_attempt TO agentledger_auditor;

-- ---------------------------------------------------------------- row-level security
-- The tenant is bound per transaction: SELECT set_config('agentledger.tenant_id', $1, true).
-- Unset or empty means NULL, which matches no row.
CREATE FUNCTION agentledger_current_tenant() RETURNS uuid
  LANGUAGE sql STABLE
  AS $$ SELECT NULLIF(current_setting('agentledger.tenant_id', true), '')::uuid $$;

ALTER TABLE agent_command ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_command FORCE ROW LEVEL SECURITY;
ALTER TABLE command_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE command_outbox FORCE ROW LEVEL SECURITY;
ALTER TABLE event_outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE event_outbox FORCE ROW LEVEL SECURITY;
ALTER TABLE command_attempt ENABLE ROW LEVEL SECURITY;
ALTER TABLE command_attempt FORCE ROW LEVEL SECURITY;
ALTER TABLE tenant_data_key ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_data_key FORCE ROW LEVEL SECURITY;

CREATE POLICY tenant_isolation ON agent_command
  TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON command_attempt
  TO agentledger_executor, agentledger_reconciler, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON tenant_data_key
  TO agentledger_admission, agentledger_executor, agentledger_reconciler
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON command_outbox
  TO agentledger_admission
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
CREATE POLICY tenant_isolation ON event_outbox
  TO agentledger_admission, agentledger_executor, agentledger_reconciler
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
-- Retention runs across tenants; its column grants only let it purge payloads.
CREATE POLICY retention_purge ON agent_command TO agentledger_maintenance USING (true);
-- The relay publishes every tenant's obligations: it needs no tenant, and may only read and
-- delete (the sweep), which its grants already limit.
CREATE POLICY relay_sweep ON command_outbox TO agentledger_relay USING (true);
CREATE POLICY relay_sweep ON event_outbox TO agentledger_relay USING (true);
