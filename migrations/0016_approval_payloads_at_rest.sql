-- Data at rest beyond the ledger (R3.6, issue 17 §5). An approval request kept its payload
-- ciphertext forever after its decision and retention could not reach it; its evidence
-- excerpts (text the planner read from business systems) were stored as plaintext jsonb.
-- Now the excerpts are encrypted with the tenant's data key like the payload
-- (`evidence_ciphertext`; the jsonb keeps only ref, source, sha256 and fetch time), and the
-- retention purge clears both ciphertexts of requests decided longer ago than the window.

ALTER TABLE approval_request
  ALTER COLUMN payload_ciphertext DROP NOT NULL,
  ALTER COLUMN payload_key_version DROP NOT NULL,
  ADD COLUMN evidence_ciphertext bytea,
  ADD COLUMN evidence_key_version integer,
  ADD COLUMN payload_purged_at timestamptz,
  ADD CONSTRAINT approval_request_payload_kept CHECK (
    state <> 'pending' OR (payload_ciphertext IS NOT NULL AND payload_key_version IS NOT NULL));

GRANT SELECT ON approval_request TO agentledger_maintenance;
GRANT UPDATE (payload_ciphertext, payload_key_version, evidence, evidence_ciphertext,
              evidence_key_version, payload_purged_at)
  ON approval_request TO agentledger_maintenance;
-- Retention runs across tenants; its column grants only let it purge, and only decided rows.
CREATE POLICY retention_purge ON approval_request TO agentledger_maintenance
  USING (state <> 'pending') WITH CHECK (state <> 'pending');
