-- Narrow-only edits (issue 42): an approver may narrow a pending request (a lower amount, a
-- subset of a list) where the action declares it (the allowlist's `narrowable`). The edit is
-- a new request for the same intent, with its own hash, linked to the original by
-- `narrowed_from`; the original closes `narrowed` (a terminal state of its own: it never runs)
-- in the same transaction, which also approves the new request as the approver who narrowed
-- it (agentledger.approvals.narrowing).
--
-- A narrowed request's budget reservations are given back like a superseded one's (the
-- trigger of 0040 gains the state); the narrowed request reserves its own amount.

ALTER TABLE approval_request DROP CONSTRAINT approval_request_state_check;
ALTER TABLE approval_request ADD CONSTRAINT approval_request_state_check
  CHECK (state IN ('pending', 'approved', 'denied', 'expired', 'superseded', 'narrowed'));

ALTER TABLE approval_request
  ADD COLUMN narrowed_from uuid REFERENCES approval_request (approval_id);
-- One narrowing per request: a request narrowed twice would have two live successors.
CREATE UNIQUE INDEX approval_request_narrowed_once ON approval_request (narrowed_from)
  WHERE narrowed_from IS NOT NULL;

DROP TRIGGER budget_charge_on_request_end ON approval_request;
CREATE TRIGGER budget_charge_on_request_end AFTER UPDATE OF state ON approval_request
  FOR EACH ROW
  WHEN (OLD.state = 'pending' AND NEW.state IN ('denied', 'expired', 'superseded', 'narrowed'))
  EXECUTE FUNCTION agentledger_budget_on_request_end_v1();

-- Admission links the new request once it exists (approvals.request inserts it).
GRANT UPDATE (narrowed_from) ON approval_request TO agentledger_admission;
