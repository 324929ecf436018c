-- "The lease expired and no attempt ever reached the connector" is not `unknown` (issue 17):
-- right before each call the worker proves its claim is current with a conditional statement
-- (ledger/dispatch.sql `mark_sending`) that stamps the attempt. A claim whose attempts carry
-- no stamp sent nothing, so the reconciler requeues it instead of asking an operator.

ALTER TABLE command_attempt ADD COLUMN sent_at timestamptz;

-- A worker that finds its claim gone at that check closes its attempt as `abandoned`.
ALTER TABLE command_attempt DROP CONSTRAINT command_attempt_result_check;
ALTER TABLE command_attempt ADD CONSTRAINT command_attempt_result_check CHECK (result IN (
  'succeeded', 'denied', 'expired', 'unknown', 'review_required', 'failed', 'error', 'abandoned'
));
