-- The audit leaf hash of 0050 with fewer plpgsql calls (issue 41: the ledger's Postgres CPU per
-- command). Same bytes, same hash: only how the canonical text is put together changes.
--
-- 0050 built the event as a jsonb object and canonicalized it with agentledger_jcs, which calls
-- itself once per container: two plpgsql calls per event for the usual flat payload (the event,
-- its payload), each running a sorted aggregate over jsonb_each. Measured in the committed bench
-- (bench/README.md, "Levers"), the copy trigger's leaf hashes were the costliest statement
-- inside the ledger. Now:
-- * the event's own members are written in place: their names are fixed, and RFC 8785's order
--   of them is this one (event_id < operation_id < payload < recorded_at < tenant_id <
--   traceparent < type < v by code point); UUIDs and the timestamp need no escaping; the type and
--   traceparent are escaped by to_json, as jsonb prints a string (the same escape_json);
-- * the payload object's members are sorted and joined in a sub-select of this expression;
--   agentledger_jcs is called only for a nested container or a number that does not print
--   canonically already, exactly where 0050's recursion called it.
-- A null operation id, traceparent or type is `null`, as jsonb_build_object made it.
CREATE OR REPLACE FUNCTION agentledger_jcs_payload(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN v IS NULL THEN 'null'
              WHEN jsonb_typeof(v) <> 'object' THEN public.agentledger_jcs(v)
              ELSE (SELECT '{' || coalesce(string_agg(
                       to_json(key)::text || ':' ||
                       CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                              OR (jsonb_typeof(value) = 'number'
                                  AND value::text !~ '^-?[0-9]{1,15}$')
                            THEN public.agentledger_jcs(value) ELSE value::text END,
                       ',' ORDER BY key COLLATE "C"), '') || '}'
                    FROM jsonb_each(v)) END
$$;

CREATE OR REPLACE FUNCTION agentledger_audit_leaf_hash(
  p_event_id uuid, p_tenant uuid, p_operation uuid, p_type text, p_payload jsonb,
  p_traceparent text, p_recorded_at timestamptz) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT sha256('\x00'::bytea || convert_to(
    '{"event_id":' || coalesce('"' || p_event_id::text || '"', 'null')
    || ',"operation_id":' || coalesce('"' || p_operation::text || '"', 'null')
    || ',"payload":' || public.agentledger_jcs_payload(p_payload)
    || ',"recorded_at":' || coalesce('"' || to_char(p_recorded_at AT TIME ZONE 'UTC',
                                                     'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '"',
                                     'null')
    || ',"tenant_id":' || coalesce('"' || p_tenant::text || '"', 'null')
    || ',"traceparent":' || coalesce(to_json(p_traceparent)::text, 'null')
    || ',"type":' || coalesce(to_json(p_type)::text, 'null')
    || ',"v":1}', 'UTF8'))
$$;
