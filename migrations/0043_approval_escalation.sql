-- Escalation of pending approvals (issue 42 item 3). A rule may name escalate_to (a group)
-- and escalate_after (a duration): a request still pending that long after it was created is
-- escalated once — escalated_at/escalated_to set by a conditional update (only while pending
-- and not yet escalated), an `approval.escalated` audit event and the new group's
-- notifications written in that same transaction (the notifier's sweep,
-- agentledger.notify.escalation). It then expires as before (agentledger_expire_approvals).

ALTER TABLE approval_request
  ADD COLUMN escalated_at timestamptz,
  ADD COLUMN escalated_to text CHECK (length(escalated_to) BETWEEN 1 AND 64);

-- The sweep's candidates: pending, routed, not yet escalated, oldest first.
CREATE INDEX approval_request_escalation_due ON approval_request (created_at)
  WHERE state = 'pending' AND escalated_at IS NULL AND quorum_rule IS NOT NULL;

GRANT UPDATE (escalated_at, escalated_to) ON approval_request TO agentledger_notifier;
CREATE POLICY notifier_escalates ON approval_request FOR UPDATE TO agentledger_notifier
  USING (state = 'pending' AND escalated_at IS NULL) WITH CHECK (state = 'pending');
