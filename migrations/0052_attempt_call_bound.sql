-- The call bound each pre-call mark declared, on its attempt (issue 41 §6: recovery after a
-- database blip within 10 s).
--
-- The reconciler waits, after an expired lease, for the window in which a stalled holder that
-- passed its pre-call check may still send (issue 18 §1): the lease's end plus one call bound.
-- It took that bound from the connector's contract. But the bound the worker actually used is
-- the executor's (`AGENTLEDGER_CONNECTOR_CALL_TIMEOUT_S` overrides the contract, up to 30 s):
-- * shorter than the contract (the chaos tiers' 2 s against the CRM contract's 14 s), every
--   take-over after a blip waited 12 s it did not need to — the soak at load's 11.9 s after a
--   primary restart (docs/evidence/soak-load.json);
-- * longer, the reconciler could declare `unknown` (or resend) while the call might still land.
-- The mark now records the bound it renewed the lease for, margin included (seconds), in the
-- statement that stamps `sent_at` (no statement, no row version more). NULL: an attempt marked
-- before this migration, or never marked; the reconciler then assumes the longest bound any
-- worker may use (ledger.dispatch.MAX_CALL_S).
ALTER TABLE command_attempt
  ADD COLUMN call_bound_s double precision
  CONSTRAINT command_attempt_call_bound_positive CHECK (call_bound_s IS NULL OR call_bound_s > 0);
