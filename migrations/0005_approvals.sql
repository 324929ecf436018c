-- Human approvals as persisted state (SPEC R2.1-R2.5, R2.8): no lock and no open transaction
-- while a person decides. A request binds the canonical request hash and every field behind
-- it; approving admits exactly that hash, in the same transaction that records the decision.

CREATE TABLE approval_request (
  approval_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id uuid NOT NULL,
  operation_id uuid NOT NULL,
  proposal_id uuid NOT NULL,
  principal_id text NOT NULL,
  action text NOT NULL,
  connector text NOT NULL,
  resource_id text NOT NULL,
  expected_revision text,
  request_hash bytea NOT NULL CHECK (octet_length(request_hash) = 32),
  -- Encrypted like the ledger's payloads, bound to (tenant, operation): on approval the same
  -- ciphertext becomes the command's.
  payload_ciphertext bytea NOT NULL,
  payload_key_version integer NOT NULL,
  policy_version text NOT NULL,
  allowlist_version text NOT NULL,
  decision_id uuid NOT NULL,            -- the policy decision that required approval
  risk text NOT NULL,
  evidence jsonb NOT NULL DEFAULT '[]', -- the planner's snapshot: untrusted data, shown escaped
  state text NOT NULL DEFAULT 'pending'
    CHECK (state IN ('pending', 'approved', 'denied', 'expired', 'superseded')),
  expires_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  decided_by text,
  decided_at timestamptz,
  decision_reason text,
  approval_decision_id uuid,            -- the policy decision allowing this approver
  shown_hash bytea,                     -- the hash the approver was shown
  superseded_by uuid REFERENCES approval_request (approval_id),
  traceparent text,
  tracestate text,
  CHECK (state = 'pending' OR decided_at IS NOT NULL)
);
-- One open question per intent: a revised proposal supersedes the pending one.
CREATE UNIQUE INDEX approval_request_one_pending ON approval_request (tenant_id, operation_id)
  WHERE state = 'pending';
CREATE INDEX approval_request_pending ON approval_request (tenant_id, created_at)
  WHERE state = 'pending';

ALTER TABLE approval_request ENABLE ROW LEVEL SECURITY;
ALTER TABLE approval_request FORCE ROW LEVEL SECURITY;
REVOKE ALL ON approval_request FROM PUBLIC;
-- Admission (and the approvals console, which runs with the admission role) creates and
-- decides requests; nobody rewrites what a request binds.
GRANT SELECT, INSERT ON approval_request TO agentledger_admission;
GRANT UPDATE (state, decided_by, decided_at, decision_reason, approval_decision_id, shown_hash,
              superseded_by)
  ON approval_request TO agentledger_admission;
GRANT SELECT ON approval_request TO agentledger_auditor, agentledger_reconciler;
CREATE POLICY tenant_isolation ON approval_request
  TO agentledger_admission, agentledger_auditor, agentledger_reconciler
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());

-- Pending requests past their expiry are expired by the reconciler's sweep, across tenants,
-- through this function only (it changes nothing else), with an audit event each.
CREATE FUNCTION agentledger_expire_approvals(max_rows integer)
RETURNS TABLE (tenant_id uuid, operation_id uuid, approval_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
BEGIN
  RETURN QUERY
  WITH due AS (
    SELECT a.approval_id FROM public.approval_request a
    WHERE a.state = 'pending' AND a.expires_at <= now()
    ORDER BY a.expires_at LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE public.approval_request a
    SET state = 'expired', decided_at = now(), decided_by = 'system:expiry',
        decision_reason = 'no decision before the approval expired'
    FROM due WHERE a.approval_id = due.approval_id
    RETURNING a.tenant_id, a.operation_id, a.approval_id, a.action, a.traceparent
  ), audited AS (
    INSERT INTO public.event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type,
                                     payload, traceparent)
    SELECT e.tenant_id, e.operation_id, 'audit', e.tenant_id::text, 'approval.expired',
           jsonb_build_object('operation_id', e.operation_id, 'approval_id', e.approval_id,
                              'action', e.action),
           e.traceparent
    FROM expired e
    RETURNING 1
  )
  SELECT e.tenant_id, e.operation_id, e.approval_id FROM expired e;
END $$;
REVOKE ALL ON FUNCTION agentledger_expire_approvals(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_expire_approvals(integer) TO agentledger_reconciler;
