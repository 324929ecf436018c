-- N-of-M approvals (issue 42, R16.2). A request may need N distinct approvers of a role
-- (the operator's approval rules, agentledger.approvals.quorum): admission stores N, the role
-- and the rule on the request; each approval is a vote bound to the request's hash, one per
-- approver (the same person twice counts once); the request is approved, and its command
-- admitted, by the vote that reaches N — in that vote's transaction, under the request's row
-- lock, so two last votes never both admit. The requester never votes (Cedar's
-- no-self-approval and a check in approvals.decide); one denial closes the request denied.

ALTER TABLE approval_request
  ADD COLUMN required_approvals integer NOT NULL DEFAULT 1
    CHECK (required_approvals BETWEEN 1 AND 20),
  ADD COLUMN approver_role text CHECK (length(approver_role) BETWEEN 1 AND 100),
  ADD COLUMN quorum_rule text CHECK (length(quorum_rule) BETWEEN 1 AND 64);

CREATE TABLE approval_vote (
  tenant_id    uuid        NOT NULL,
  approval_id  uuid        NOT NULL,
  approver     text        NOT NULL CHECK (length(approver) BETWEEN 1 AND 200),
  request_hash bytea       NOT NULL,
  decision_id  uuid        NOT NULL,
  voted_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, approval_id, approver),
  FOREIGN KEY (approval_id) REFERENCES approval_request (approval_id)
);

ALTER TABLE approval_vote ENABLE ROW LEVEL SECURITY;
ALTER TABLE approval_vote FORCE ROW LEVEL SECURITY;
REVOKE ALL ON approval_vote FROM PUBLIC;
GRANT SELECT, INSERT ON approval_vote TO agentledger_admission;
GRANT SELECT ON approval_vote TO agentledger_auditor;
CREATE POLICY tenant_isolation ON approval_vote TO agentledger_admission, agentledger_auditor
  USING (tenant_id = agentledger_current_tenant())
  WITH CHECK (tenant_id = agentledger_current_tenant());
