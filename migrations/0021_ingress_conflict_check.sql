-- Ingress answered 202 to a resubmission that admission then answered `conflict`, though the
-- conflict was knowable at once: the operation id (derived from the caller's Idempotency-Key)
-- already holds a command with another request hash (issue 18 §2). Ingress gets exactly one
-- question it may ask the ledger — "which request hash does this operation hold?" — through a
-- SECURITY DEFINER function; its role can read no table. The hash is a digest of the fields an
-- approval binds, never the payload.

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentledger_ingress') THEN
    CREATE ROLE agentledger_ingress NOLOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE;
  END IF;
END $$;

CREATE FUNCTION agentledger_admitted_hash(tenant uuid, operation uuid)
RETURNS bytea
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public
AS $$
  SELECT c.request_hash FROM public.agent_command c
  WHERE c.tenant_id = tenant AND c.operation_id = operation
$$;
-- Owned like the other cross-tenant searches (0015): agentledger_sweeper reads commands.
ALTER FUNCTION agentledger_admitted_hash(uuid, uuid) OWNER TO agentledger_sweeper;
REVOKE ALL ON FUNCTION agentledger_admitted_hash(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agentledger_admitted_hash(uuid, uuid) TO agentledger_ingress;
