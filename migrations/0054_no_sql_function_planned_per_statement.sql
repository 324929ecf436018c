-- No SQL function body parsed and planned again for every statement that calls it (issue 41:
-- the ledger's Postgres CPU per command, and its latency at low rates).
--
-- A LANGUAGE sql function that the planner cannot inline (its body has a sub-select, a CTE or
-- an aggregate) is run by the SQL-function executor, which parses, analyses and plans its body
-- once per call site per execution of the calling statement, and keeps that plan for that
-- execution only. A plpgsql function keeps its plans for the whole session. Two of those were
-- on the hot path:
--
-- * agentledger_jcs_payload (0051, a sub-select sorting the payload's members), called by
--   the audit copy trigger's INSERT once per row. 0051 was measured over 3,000 events in one
--   statement, where one planning is shared; the copy trigger fires once per admitting,
--   claiming or finalizing statement, for a few rows. pgbench, canonical forms of 1-3 real
--   audit payloads per statement on an idle box: 0.35-0.41 ms, now 0.20-0.30 ms (the same
--   SELECT without them 0.05-0.14 ms).
-- * agentledger_xid_visible (0018), called by the relay once per read pass and by an executor
--   before it dead-letters a record: a CTE of three levels, planned on every EXECUTE of the
--   relay's prepared statement. pgbench, five xids per statement: 0.26 ms, now 0.09 ms.
--
-- Same results: agentledger_jcs_payload the same text (0 mismatches over 3,312 audit events of
-- a burst); agentledger_xid_visible the same 64-bit xid and the same answer, from the
-- statement's snapshot.

-- agentledger_jcs's object branch is 0051's single pass with 0053's check for names above
-- U+FFFF, one plpgsql call, plans kept for the session: the payload's canonical form is that
-- call (a null payload is `null`). No sub-select left, so the leaf hash inlines this function
-- and calls agentledger_jcs once per event.
CREATE OR REPLACE FUNCTION agentledger_jcs_payload(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT coalesce(public.agentledger_jcs(v), 'null')
$$;

-- Whether the transaction of 32-bit xid `xid32` is visible in snapshot `snap`. The 64-bit xid
-- is rebuilt from the snapshot's xmax epoch: a streamed xid is never newer than xmax, so one
-- that would be is of the epoch before. Each parameter's expression is cheap and the body has
-- no FROM, CTE or sub-select: the planner inlines it into the caller's plan.
CREATE FUNCTION agentledger_xid_visible_in(xid32 bigint, snap pg_snapshot) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT pg_visible_in_snapshot((
    CASE WHEN ((pg_snapshot_xmax(snap)::text::bigint >> 32) << 32) + xid32
                >= pg_snapshot_xmax(snap)::text::bigint
              AND pg_snapshot_xmax(snap)::text::bigint >> 32 > 0
         THEN (((pg_snapshot_xmax(snap)::text::bigint >> 32) - 1) << 32) + xid32
         ELSE ((pg_snapshot_xmax(snap)::text::bigint >> 32) << 32) + xid32
    END)::text::xid8, snap)
$$;

CREATE OR REPLACE FUNCTION agentledger_xid_visible(xid32 bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT public.agentledger_xid_visible_in(xid32, pg_current_snapshot())
$$;
