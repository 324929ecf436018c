-- A function's name means one thing (issue 22): four functions were redefined under their
-- first name when their signature or meaning changed, so a query naming one said nothing of
-- which rule it ran. Each now carries the version of its current definition; a later change
-- of signature or meaning creates the next version in a new migration (migrations/schema.sql
-- states the rule). RENAME keeps each function's body, owner (SECURITY DEFINER, 0015),
-- search_path and grants as they are: behaviour is unchanged.
--
--   agentledger_budget_reserve        v1 0003; v2 0007: idempotent per operation
--   agentledger_needs_reconciliation  v1 0004; v2 0010: lookup connectors first;
--                                     v3 0012: leaves commands past the retry cap alone
--   agentledger_stranded_pending      v1 0011; v2 0019: honours a requeue's retry_at
--   agentledger_end_leases_of         v1 0017; v2 0020: also closes the open attempts
--
-- The old names go: nothing calls them any more. Apply this migration with the release whose
-- queries call the new names (the migrate job runs before the rollout; a process of the
-- previous release calling an old name until it is replaced gets a retryable storage error).

ALTER FUNCTION agentledger_budget_reserve(uuid, text, text, bigint, uuid)
  RENAME TO agentledger_budget_reserve_v2;
ALTER FUNCTION agentledger_needs_reconciliation(integer, text[], integer)
  RENAME TO agentledger_needs_reconciliation_v3;
ALTER FUNCTION agentledger_stranded_pending(integer, interval)
  RENAME TO agentledger_stranded_pending_v2;
ALTER FUNCTION agentledger_end_leases_of(text)
  RENAME TO agentledger_end_leases_of_v2;
