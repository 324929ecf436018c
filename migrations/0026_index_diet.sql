-- Fewer index entries and room for HOT updates on the hot tables (issue 41, lever 6).
--
-- agent_command_dispatchable without 'pending': every admission inserted an entry no query
-- reads (pending commands are found through agent_command_pending_age by the stranded scan,
-- and by primary key everywhere else). The reconciler's searches (dispatching past their
-- lease, unknown) and the end of a predecessor's leases read the same index as before; the
-- EXPLAINs of each, before and after, are in bench/README.md.
CREATE INDEX agent_command_recoverable ON agent_command (state, lease_until)
  WHERE state IN ('dispatching', 'unknown');
DROP INDEX agent_command_dispatchable;

-- Free space on each page so an update that changes no indexed column stays on its page
-- (HOT: no index entry, less vacuum): an attempt's stamp and end, a budget's spend.
ALTER TABLE agent_command SET (fillfactor = 80);
ALTER TABLE command_attempt SET (fillfactor = 80);
ALTER TABLE budget SET (fillfactor = 80);
