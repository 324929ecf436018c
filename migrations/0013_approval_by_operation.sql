-- An identity envelope admits one content (issue 17 §6): before asking for an approval,
-- admission checks that the proposal id was never requested with another hash for the same
-- intent. This index keeps that check (and every per-intent read) off a tenant-wide scan.

CREATE INDEX approval_request_operation ON approval_request (tenant_id, operation_id, proposal_id);
