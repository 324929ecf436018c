-- One definition of "is this transaction visible yet?" for the relay (before it publishes a
-- streamed transaction) and the executor (before it dead-letters a record whose command it
-- cannot find), issue 18. pgoutput and the relay's `xid` header carry 32-bit xids: the 64-bit
-- xid is rebuilt from the snapshot's xmax epoch (a streamed xid is never newer than xmax).

CREATE FUNCTION agentledger_xid_visible(xid32 bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  WITH s AS (SELECT pg_current_snapshot() AS snap),
       x AS (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax FROM s),
       f AS (SELECT snap, CASE WHEN ((xmax >> 32) << 32) + xid32 >= xmax AND xmax >> 32 > 0
                               THEN (((xmax >> 32) - 1) << 32) + xid32
                               ELSE ((xmax >> 32) << 32) + xid32 END AS full_xid FROM x)
  SELECT pg_visible_in_snapshot(full_xid::text::xid8, snap) FROM f
$$;
