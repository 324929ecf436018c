-- Shadow runs never write (SPEC R9.2), enforced twice: admission refuses a proposal marked
-- shadow, and the executor refuses to dispatch a command the ledger marks shadow. This flag is
-- the executor's half: should a shadow command ever reach the ledger (an admission bug, a
-- manual insert), dispatch finalizes it as denied without calling any connector.
--
-- No service role may change it once written: admission may only INSERT rows (the default
-- is false), and the executor's and reconciler's column grants (migration 0002) leave it out.

ALTER TABLE agent_command ADD COLUMN shadow boolean NOT NULL DEFAULT false;
