-- The current agentledger schema: tables, indexes, functions, triggers, grants, row-level
-- security policies and publications, as a fresh run of every migration in this directory
-- leaves them. GENERATED, do not edit: regenerate with
--     .venv/bin/python -m agentledger.migrations dump-schema  (make schema)
-- tests/integration/test_schema_file.py fails when a fresh migration run differs from it.
--
-- Migrations (NNNN_*.sql) are the deltas that production applies, in order; this file is
-- where a reader sees what they add up to (the newest body of every function included).
--
-- Rule: a function whose signature or meaning changes gets a NEW versioned name in a new
-- migration (agentledger_budget_reserve_v2, ...), which drops the old name once nothing
-- calls it; never CREATE OR REPLACE a function with another meaning under its old name, so
-- a name found in a query always means one thing.
--
-- Objects owned by the role that ran the migrations carry no OWNER line; SECURITY DEFINER
-- functions keep theirs (they run with their owner's rights, migration 0015).
-- Roles are cluster-level objects, so pg_dump leaves them out; the group roles the
-- migrations create (NOLOGIN; services log in as members, see agentledger.logins) are
-- listed at the end as comments.

--
-- PostgreSQL database dump
--

--
-- Name: agentledger_admitted_hash(uuid, uuid); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_admitted_hash(tenant uuid, operation uuid) RETURNS bytea
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  SELECT c.request_hash FROM public.agent_command c
  WHERE c.tenant_id = tenant AND c.operation_id = operation
$$;

ALTER FUNCTION public.agentledger_admitted_hash(tenant uuid, operation uuid) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_audit_is_append_only(); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_audit_is_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
  RAISE EXCEPTION 'audit_event is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;

--
-- Name: agentledger_audit_leaf_hash(uuid, uuid, uuid, text, jsonb, text, timestamp with time zone); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_audit_leaf_hash(p_event_id uuid, p_tenant uuid, p_operation uuid, p_type text, p_payload jsonb, p_traceparent text, p_recorded_at timestamp with time zone) RETURNS bytea
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

--
-- Name: agentledger_budget_charge_v1(uuid, uuid, jsonb); Type: FUNCTION; Schema: public; Owner: agentledger_budget_counter
--

CREATE FUNCTION public.agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
DECLARE
  v_fresh jsonb;
  v_refused record;
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  -- A per-call budget needs no running total: the amount alone is checked.
  SELECT c.budget, c.scope, c.scope_key, c.window_kind, c.window_start, c.unit, c.currency,
         c.amount, c."limit", 0::bigint AS spent
  INTO v_refused
  FROM jsonb_to_recordset(p_charges) AS c(budget text, scope text, scope_key text,
       window_kind text, window_start timestamptz, unit text, currency text, amount bigint,
       "limit" bigint)
  WHERE c.window_kind = 'call' AND c.amount > c."limit"
  ORDER BY c.budget LIMIT 1;
  IF NOT FOUND THEN
    -- The charges this operation does not hold yet (waits for a concurrent first admission
    -- of the same key, then skips what it charged).
    WITH fresh AS (
      INSERT INTO budget_charge (tenant_id, operation_id, budget, scope, scope_key,
                                 window_kind, window_start, unit, currency, amount,
                                 limit_amount)
      SELECT p_tenant, p_operation, c.budget, c.scope, c.scope_key, c.window_kind,
             c.window_start, c.unit, c.currency, c.amount, c."limit"
      FROM jsonb_to_recordset(p_charges) AS c(budget text, scope text, scope_key text,
           window_kind text, window_start timestamptz, unit text, currency text,
           amount bigint, "limit" bigint)
      ON CONFLICT (tenant_id, operation_id, budget) WHERE state <> 'released' DO NOTHING
      RETURNING budget, scope, scope_key, window_kind, window_start, unit, currency, amount,
                limit_amount
    )
    SELECT jsonb_agg(to_jsonb(fresh)) INTO v_fresh FROM fresh;
    IF v_fresh IS NULL THEN
      RETURN NULL;  -- counted already
    END IF;
    INSERT INTO budget_window (tenant_id, budget, scope_key, window_start, limit_amount)
    SELECT p_tenant, f.budget, f.scope_key, f.window_start, f.limit_amount
    FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text, window_start timestamptz,
         limit_amount bigint)
    WHERE f.window_start IS NOT NULL
    ORDER BY f.budget, f.scope_key, f.window_start
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM budget_window AS w
    WHERE w.tenant_id = p_tenant
      AND (w.budget, w.scope_key, w.window_start) IN (
        SELECT f.budget, f.scope_key, f.window_start
        FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text,
             window_start timestamptz))
    ORDER BY w.budget, w.scope_key, w.window_start
    FOR UPDATE;
    -- Under the locks, this statement's snapshot holds every committed charge.
    SELECT f.budget, f.scope, f.scope_key, f.window_kind, f.window_start, f.unit, f.currency,
           f.amount, f.limit_amount AS "limit", w.reserved + w.used AS spent
    INTO v_refused
    FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope text, scope_key text,
         window_kind text, window_start timestamptz, unit text, currency text, amount bigint,
         limit_amount bigint)
    JOIN budget_window AS w ON w.tenant_id = p_tenant AND w.budget = f.budget
      AND w.scope_key = f.scope_key AND w.window_start = f.window_start
    WHERE w.reserved + w.used + f.amount > f.limit_amount
    ORDER BY f.budget LIMIT 1;
    IF NOT FOUND THEN
      UPDATE budget_window AS w
      SET reserved = w.reserved + f.amount, limit_amount = f.limit_amount, updated_at = now()
      FROM jsonb_to_recordset(v_fresh) AS f(budget text, scope_key text,
           window_start timestamptz, amount bigint, limit_amount bigint)
      WHERE w.tenant_id = p_tenant AND w.budget = f.budget AND w.scope_key = f.scope_key
        AND w.window_start = f.window_start;
      RETURN NULL;
    END IF;
    DELETE FROM budget_charge AS b
    WHERE b.tenant_id = p_tenant AND b.operation_id = p_operation AND b.state = 'reserved'
      AND b.budget IN (SELECT f.budget FROM jsonb_to_recordset(v_fresh) AS f(budget text));
  END IF;
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload)
  VALUES (p_tenant, p_operation, 'audit', p_tenant::text, 'budget.exhausted',
          jsonb_build_object('operation_id', p_operation, 'budget', v_refused.budget,
                             'scope', v_refused.scope, 'scope_key', v_refused.scope_key,
                             'window', v_refused.window_kind,
                             'window_start', v_refused.window_start,
                             'unit', v_refused.unit, 'currency', v_refused.currency,
                             'amount', v_refused.amount, 'limit', v_refused."limit",
                             'spent', v_refused.spent));
  RETURN v_refused.budget;
END $$;

ALTER FUNCTION public.agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb) OWNER TO agentledger_budget_counter;

--
-- Name: agentledger_budget_on_command_end_v1(); Type: FUNCTION; Schema: public; Owner: agentledger_budget_counter
--

CREATE FUNCTION public.agentledger_budget_on_command_end_v1() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
  PERFORM agentledger_budget_settle_charges_v1(
    NEW.tenant_id, NEW.operation_id,
    CASE WHEN NEW.state = 'succeeded' THEN 'settled' ELSE 'released' END);
  RETURN NULL;
END $$;

ALTER FUNCTION public.agentledger_budget_on_command_end_v1() OWNER TO agentledger_budget_counter;

--
-- Name: agentledger_budget_on_request_end_v1(); Type: FUNCTION; Schema: public; Owner: agentledger_budget_counter
--

CREATE FUNCTION public.agentledger_budget_on_request_end_v1() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
  PERFORM agentledger_budget_settle_charges_v1(NEW.tenant_id, NEW.operation_id, 'released');
  RETURN NULL;
END $$;

ALTER FUNCTION public.agentledger_budget_on_request_end_v1() OWNER TO agentledger_budget_counter;

--
-- Name: agentledger_budget_open_default(uuid, text, text); Type: FUNCTION; Schema: public; Owner: agentledger_budget_keeper
--

CREATE FUNCTION public.agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO budget (tenant_id, workflow_id, kind, limit_amount)
  SELECT d.tenant_id, p_workflow, d.kind, d.limit_amount
  FROM budget_default AS d WHERE d.tenant_id = p_tenant AND d.kind = p_kind
  ON CONFLICT (tenant_id, workflow_id, kind) DO NOTHING;
  RETURN EXISTS (SELECT 1 FROM budget AS b
                 WHERE b.tenant_id = p_tenant AND b.workflow_id = p_workflow AND b.kind = p_kind);
END $$;

ALTER FUNCTION public.agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text) OWNER TO agentledger_budget_keeper;

--
-- Name: agentledger_budget_reserve_v2(uuid, text, text, bigint, uuid); Type: FUNCTION; Schema: public; Owner: agentledger_budget_keeper
--

CREATE FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid DEFAULT NULL::uuid) RETURNS TABLE(reservation_id uuid, outcome text, limit_amount bigint, reserved bigint, used bigint, deadline timestamp with time zone)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
  b record;
  v_outcome text;
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF p_amount IS NULL OR p_amount <= 0 THEN
    RAISE EXCEPTION 'a reservation amount must be positive' USING ERRCODE = 'check_violation';
  END IF;

  -- Idempotent per operation: a redelivered proposal whose admission died after reserving
  -- (before its commit) finds its open reservation instead of taking a second one.
  IF p_operation_id IS NOT NULL THEN
    RETURN QUERY
    SELECT r.reservation_id, 'reserved'::text, t.limit_amount, t.reserved, t.used, t.deadline
    FROM budget_reservation AS r
    JOIN budget AS t ON t.tenant_id = r.tenant_id AND t.workflow_id = r.workflow_id
                    AND t.kind = r.kind
    WHERE r.tenant_id = p_tenant AND r.workflow_id = p_workflow AND r.kind = p_kind
      AND r.operation_id = p_operation_id AND r.state = 'reserved' AND r.amount = p_amount;
    IF FOUND THEN
      RETURN;
    END IF;
  END IF;

  RETURN QUERY
  WITH taken AS (
    UPDATE budget AS t
    SET reserved = t.reserved + p_amount, updated_at = now()
    WHERE t.tenant_id = p_tenant AND t.workflow_id = p_workflow AND t.kind = p_kind
      AND t.limit_amount - t.reserved - t.used >= p_amount
      AND (t.deadline IS NULL OR t.deadline > now())
    RETURNING t.tenant_id, t.workflow_id, t.kind, t.limit_amount, t.reserved, t.used, t.deadline
  ), held AS (
    INSERT INTO budget_reservation (tenant_id, workflow_id, kind, amount, operation_id)
    SELECT tenant_id, workflow_id, kind, p_amount, p_operation_id FROM taken
    RETURNING budget_reservation.reservation_id
  )
  SELECT held.reservation_id, 'reserved'::text, taken.limit_amount, taken.reserved, taken.used,
         taken.deadline
  FROM held CROSS JOIN taken;
  IF FOUND THEN
    RETURN;
  END IF;

  SELECT t.limit_amount, t.reserved, t.used, t.deadline INTO b
  FROM budget AS t
  WHERE t.tenant_id = p_tenant AND t.workflow_id = p_workflow AND t.kind = p_kind;
  v_outcome := CASE
    WHEN NOT FOUND THEN 'no_budget'
    WHEN b.deadline IS NOT NULL AND b.deadline <= now() THEN 'deadline_passed'
    ELSE 'exhausted'
  END;
  INSERT INTO event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type, payload)
  VALUES (p_tenant, p_operation_id, 'audit', p_tenant::text, 'budget.exhausted',
          jsonb_build_object('workflow_id', p_workflow, 'kind', p_kind, 'requested', p_amount,
                             'reason', v_outcome, 'limit', b.limit_amount,
                             'reserved', b.reserved, 'used', b.used, 'deadline', b.deadline,
                             'operation_id', p_operation_id));
  RETURN QUERY SELECT NULL::uuid, v_outcome, b.limit_amount::bigint, b.reserved::bigint,
                      b.used::bigint, b.deadline::timestamptz;
END $$;

ALTER FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) OWNER TO agentledger_budget_keeper;

--
-- Name: agentledger_budget_settle(uuid, uuid, bigint); Type: FUNCTION; Schema: public; Owner: agentledger_budget_keeper
--

CREATE FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) RETURNS TABLE(reservation_id uuid, workflow_id text, kind text, amount bigint, used_amount bigint, state text, operation_id uuid, settled_now boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
  IF p_tenant IS NULL OR p_tenant IS DISTINCT FROM agentledger_current_tenant() THEN
    RAISE EXCEPTION 'budget tenant is not the transaction''s tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;

  RETURN QUERY
  WITH settled AS (
    UPDATE budget_reservation AS r
    SET state = CASE WHEN p_used IS NULL THEN 'released' ELSE 'committed' END,
        used_amount = CASE WHEN p_used IS NULL OR r.kind = 'concurrent_steps' THEN 0
                           ELSE p_used END,
        settled_at = now()
    WHERE r.tenant_id = p_tenant AND r.reservation_id = p_reservation_id
      AND r.state = 'reserved'
    RETURNING r.tenant_id, r.reservation_id, r.workflow_id, r.kind, r.amount, r.used_amount,
              r.state, r.operation_id
  ), returned AS (
    UPDATE budget AS t
    SET reserved = t.reserved - s.amount, used = t.used + s.used_amount, updated_at = now()
    FROM settled AS s
    WHERE t.tenant_id = s.tenant_id AND t.workflow_id = s.workflow_id AND t.kind = s.kind
    RETURNING 1
  )
  SELECT s.reservation_id, s.workflow_id, s.kind, s.amount, s.used_amount, s.state,
         s.operation_id, true
  FROM settled AS s;
  IF FOUND THEN
    RETURN;
  END IF;

  RETURN QUERY
  SELECT r.reservation_id, r.workflow_id, r.kind, r.amount, r.used_amount, r.state,
         r.operation_id, false
  FROM budget_reservation AS r
  WHERE r.tenant_id = p_tenant AND r.reservation_id = p_reservation_id;
END $$;

ALTER FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) OWNER TO agentledger_budget_keeper;

--
-- Name: agentledger_budget_settle_charges_v1(uuid, uuid, text); Type: FUNCTION; Schema: public; Owner: agentledger_budget_counter
--

CREATE FUNCTION public.agentledger_budget_settle_charges_v1(p_tenant uuid, p_operation uuid, p_state text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
BEGIN
  WITH moved AS (
    UPDATE budget_charge AS b SET state = p_state, settled_at = now()
    WHERE b.tenant_id = p_tenant AND b.operation_id = p_operation AND b.state = 'reserved'
    RETURNING b.budget, b.scope_key, b.window_start, b.amount
  )
  UPDATE budget_window AS w
  SET reserved = w.reserved - m.amount,
      used = w.used + CASE WHEN p_state = 'settled' THEN m.amount ELSE 0 END,
      updated_at = now()
  FROM moved AS m
  WHERE w.tenant_id = p_tenant AND w.budget = m.budget AND w.scope_key = m.scope_key
    AND w.window_start = m.window_start;
END $$;

ALTER FUNCTION public.agentledger_budget_settle_charges_v1(p_tenant uuid, p_operation uuid, p_state text) OWNER TO agentledger_budget_counter;

--
-- Name: agentledger_copy_audit_events_v3(); Type: FUNCTION; Schema: public; Owner: agentledger_audit_writer
--

CREATE FUNCTION public.agentledger_copy_audit_events_v3() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
BEGIN
  INSERT INTO public.audit_event (event_id, tenant_id, operation_id, type, payload, traceparent,
                                  recorded_at, leaf_hash)
  SELECT n.id, n.tenant_id, n.operation_id, n.type, n.payload, n.traceparent, n.created_at,
         public.agentledger_audit_leaf_hash(n.id, n.tenant_id, n.operation_id, n.type, n.payload,
                                            n.traceparent, n.created_at)
  FROM new_events AS n
  WHERE n.aggregatetype = 'audit' AND n.type <> 'log.checkpoint';
  RETURN NULL;
END $$;

ALTER FUNCTION public.agentledger_copy_audit_events_v3() OWNER TO agentledger_audit_writer;

--
-- Name: agentledger_current_tenant(); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_current_tenant() RETURNS uuid
    LANGUAGE sql STABLE
    AS $$ SELECT NULLIF(current_setting('agentledger.tenant_id', true), '')::uuid $$;

--
-- Name: agentledger_end_leases_of_v2(text); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_end_leases_of_v2(worker text) RETURNS integer
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  WITH ended AS (
    UPDATE public.agent_command c
    SET lease_until = now() - interval '1 millisecond', updated_at = now()
    WHERE c.state = 'dispatching' AND c.claimed_by = worker AND c.lease_until > now()
    RETURNING c.tenant_id, c.operation_id
  ), closed AS (
    UPDATE public.command_attempt a
    SET finished_at = now(), result = 'abandoned',
        detail = 'its worker restarted under the same identity: the process that made this '
                 'attempt is gone'
    FROM ended e
    WHERE a.tenant_id = e.tenant_id AND a.operation_id = e.operation_id
      AND a.worker_id = worker AND a.finished_at IS NULL
    RETURNING 1
  )
  SELECT count(*)::integer FROM ended
$$;

ALTER FUNCTION public.agentledger_end_leases_of_v2(worker text) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_expire_approvals(integer); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_expire_approvals(max_rows integer) RETURNS TABLE(tenant_id uuid, operation_id uuid, approval_id uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
BEGIN
  RETURN QUERY
  WITH due AS (
    SELECT a.approval_id FROM public.approval_request a
    WHERE a.state = 'pending' AND a.expires_at <= now()
    ORDER BY a.expires_at LIMIT max_rows
    FOR UPDATE SKIP LOCKED
  ), expired AS (
    UPDATE public.approval_request a
    SET state = 'expired', decided_at = now(), decided_by = 'system:expiry',
        decision_reason = 'no decision before the approval expired'
    FROM due WHERE a.approval_id = due.approval_id
    RETURNING a.tenant_id, a.operation_id, a.approval_id, a.action, a.traceparent
  ), audited AS (
    INSERT INTO public.event_outbox (tenant_id, operation_id, aggregatetype, aggregateid, type,
                                     payload, traceparent)
    SELECT e.tenant_id, e.operation_id, 'audit', e.tenant_id::text, 'approval.expired',
           jsonb_build_object('operation_id', e.operation_id, 'approval_id', e.approval_id,
                              'action', e.action),
           e.traceparent
    FROM expired e
    RETURNING 1
  )
  SELECT e.tenant_id, e.operation_id, e.approval_id FROM expired e;
END $$;

ALTER FUNCTION public.agentledger_expire_approvals(max_rows integer) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_jcs(jsonb); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_jcs(v jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $_$
DECLARE
  out text;
  wide boolean;
BEGIN
  CASE jsonb_typeof(v)
  WHEN 'object' THEN
    SELECT '{' || coalesce(string_agg(
             to_json(key)::text || ':' ||
             CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                    OR (jsonb_typeof(value) = 'number' AND value::text !~ '^-?[0-9]{1,15}$')
                  THEN public.agentledger_jcs(value) ELSE value::text END,
             ',' ORDER BY key COLLATE "C"), '') || '}',
           bool_or(public.agentledger_jcs_wide(key))
    INTO out, wide FROM jsonb_each(v);
    IF wide THEN
      SELECT '{' || string_agg(
               to_json(key)::text || ':' ||
               CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                      OR (jsonb_typeof(value) = 'number' AND value::text !~ '^-?[0-9]{1,15}$')
                    THEN public.agentledger_jcs(value) ELSE value::text END,
               ',' ORDER BY public.agentledger_utf16_key(key)) || '}'
      INTO out FROM jsonb_each(v);
    END IF;
  WHEN 'array' THEN
    SELECT '[' || coalesce(string_agg(
             CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                    OR (jsonb_typeof(value) = 'number' AND value::text !~ '^-?[0-9]{1,15}$')
                  THEN public.agentledger_jcs(value) ELSE value::text END,
             ',' ORDER BY i), '') || ']'
    INTO out FROM jsonb_array_elements(v) WITH ORDINALITY AS a (value, i);
  WHEN 'number' THEN
    out := public.agentledger_jcs_number(v::text::numeric);
  ELSE
    out := v::text;  -- a string (jsonb prints it escaped as JSON), true, false, null
  END CASE;
  RETURN out;
END $_$;

--
-- Name: agentledger_jcs_number(numeric); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_jcs_number(n numeric) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
  s text;
  neg boolean;
  mant text;
  e int := 0;
  digits text;
  point int;
  k int;
  p int;  -- the value is 0.digits x 10^p
BEGIN
  IF n = trunc(n) AND abs(n) <= 9007199254740991 THEN
    RETURN n::bigint::text;
  END IF;
  IF abs(n) > 1.7976931348623157e308 OR abs(n) < 2.2250738585072014e-308 THEN
    BEGIN  -- outside the doubles' normal range (rare: a block costs a subtransaction)
      s := n::float8::text;
    EXCEPTION WHEN numeric_value_out_of_range THEN
      -- No IEEE 754 double: RFC 8785 has no form for it (the verifiers refuse the row, a
      -- false alarm); the write it belongs to must not fail for it.
      RETURN n::text;
    END;
  ELSE
    s := n::float8::text;                     -- shortest round-trip digits (PostgreSQL >= 12)
  END IF;
  neg := left(s, 1) = '-';
  IF neg THEN s := substr(s, 2); END IF;
  IF position('e' IN s) > 0 THEN
    mant := split_part(s, 'e', 1);
    e := split_part(s, 'e', 2)::int;
  ELSE
    mant := s;
  END IF;
  point := position('.' IN mant);
  IF point = 0 THEN
    digits := mant; p := length(mant) + e;
  ELSE
    digits := replace(mant, '.', ''); p := point - 1 + e;
  END IF;
  -- strip leading zeros (each one moves the point), then trailing zeros
  WHILE length(digits) > 1 AND left(digits, 1) = '0' LOOP
    digits := substr(digits, 2); p := p - 1;
  END LOOP;
  digits := rtrim(digits, '0');
  IF digits = '' THEN RETURN '0'; END IF;
  k := length(digits);
  IF k <= p AND p <= 21 THEN
    s := digits || repeat('0', p - k);
  ELSIF 0 < p AND p <= 21 THEN
    s := left(digits, p) || '.' || substr(digits, p + 1);
  ELSIF -6 < p AND p <= 0 THEN
    s := '0.' || repeat('0', -p) || digits;
  ELSE
    s := left(digits, 1) || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
         || 'e' || CASE WHEN p - 1 >= 0 THEN '+' ELSE '-' END || abs(p - 1)::text;
  END IF;
  RETURN CASE WHEN neg THEN '-' || s ELSE s END;
END $$;

--
-- Name: agentledger_jcs_payload(jsonb); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_jcs_payload(v jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT coalesce(public.agentledger_jcs(v), 'null')
$$;

--
-- Name: agentledger_jcs_wide(text); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_jcs_wide(k text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
  SELECT octet_length(k) > length(k) AND k ~ '[\U00010000-\U0010FFFF]'
$$;

--
-- Name: agentledger_late_applied_v1(integer); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_late_applied_v1(max_rows integer) RETURNS TABLE(tenant_id uuid, operation_id uuid, state text, connector text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  -- From the attempts' partial index (late `applied` answers are rare), never a scan of
  -- every command.
  SELECT DISTINCT ON (c.updated_at, c.tenant_id, c.operation_id)
         c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.command_attempt a
  JOIN public.agent_command c ON c.tenant_id = a.tenant_id AND c.operation_id = a.operation_id
  WHERE a.late_answer = 'applied'
    AND (c.state <> 'succeeded' OR a.late_receipt IS DISTINCT FROM c.provider_receipt)
    AND (c.state = 'unknown' OR (c.state NOT IN ('pending', 'dispatching')
                                 AND c.contradicted_at IS NULL))
  ORDER BY c.updated_at, c.tenant_id, c.operation_id
  LIMIT max_rows
$$;

ALTER FUNCTION public.agentledger_late_applied_v1(max_rows integer) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_needs_reconciliation_v3(integer, text[], integer); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_needs_reconciliation_v3(max_rows integer, lookup_connectors text[], max_generations integer) RETURNS TABLE(tenant_id uuid, operation_id uuid, state text, connector text)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  SELECT c.tenant_id, c.operation_id, c.state, c.connector
  FROM public.agent_command c
  WHERE (c.state = 'dispatching' AND c.lease_until < now())
     OR (c.state = 'unknown' AND c.connector = ANY(lookup_connectors)
         AND c.fencing_generation < max_generations)
  ORDER BY (c.state = 'unknown'), c.updated_at
  LIMIT max_rows
$$;

ALTER FUNCTION public.agentledger_needs_reconciliation_v3(max_rows integer, lookup_connectors text[], max_generations integer) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_stranded_pending_v2(integer, interval); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_stranded_pending_v2(max_rows integer, older_than interval) RETURNS TABLE(tenant_id uuid, operation_id uuid, connector text, retry_at timestamp with time zone)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  SELECT c.tenant_id, c.operation_id, c.connector, c.retry_at
  FROM public.agent_command c
  WHERE c.state = 'pending'
    AND CASE WHEN c.retry_at IS NOT NULL THEN c.retry_at <= now()
             ELSE c.updated_at < now() - older_than END
    AND NOT EXISTS (SELECT 1 FROM public.command_outbox o
                    WHERE o.tenant_id = c.tenant_id AND o.operation_id = c.operation_id)
  ORDER BY coalesce(c.retry_at, c.updated_at)
  LIMIT max_rows
$$;

ALTER FUNCTION public.agentledger_stranded_pending_v2(max_rows integer, older_than interval) OWNER TO agentledger_sweeper;

--
-- Name: agentledger_unknown_backlog_v1(); Type: FUNCTION; Schema: public; Owner: agentledger_sweeper
--

CREATE FUNCTION public.agentledger_unknown_backlog_v1() RETURNS TABLE(connector text, commands bigint, oldest_age_s double precision)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
  SELECT c.connector, count(*),
         greatest(extract(epoch FROM now() - min(coalesce(c.dispatched_at, c.updated_at))), 0)
           ::double precision
  FROM public.agent_command c
  WHERE c.state = 'unknown'
  GROUP BY c.connector
$$;

ALTER FUNCTION public.agentledger_unknown_backlog_v1() OWNER TO agentledger_sweeper;

--
-- Name: agentledger_utf16_key(text); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_utf16_key(k text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
  SELECT coalesce(decode(string_agg(
           CASE WHEN cp < 65536 THEN lpad(to_hex(cp), 4, '0')
                ELSE to_hex(55296 + ((cp - 65536) >> 10)) || to_hex(56320 + ((cp - 65536) & 1023))
           END, '' ORDER BY i), 'hex'), '\x'::bytea)
    FROM (SELECT ascii(substr(k, i, 1)) AS cp, i FROM generate_series(1, length(k)) AS i) AS c
$$;

--
-- Name: agentledger_xid_visible(bigint); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_xid_visible(xid32 bigint) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
  SELECT public.agentledger_xid_visible_in(xid32, pg_current_snapshot())
$$;

--
-- Name: agentledger_xid_visible_in(bigint, pg_snapshot); Type: FUNCTION; Schema: public
--

CREATE FUNCTION public.agentledger_xid_visible_in(xid32 bigint, snap pg_snapshot) RETURNS boolean
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

--
-- Name: agent_command; Type: TABLE; Schema: public
--

CREATE TABLE public.agent_command (
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    request_hash bytea NOT NULL,
    state text NOT NULL,
    provider_receipt text,
    lease_until timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    principal_id text NOT NULL,
    action text NOT NULL,
    connector text NOT NULL,
    resource_id text NOT NULL,
    expected_revision text,
    decision_id uuid NOT NULL,
    policy_version text NOT NULL,
    allowlist_version text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    payload_ciphertext bytea,
    payload_key_version integer,
    payload_purged_at timestamp with time zone,
    claim_token uuid,
    claimed_by text,
    fencing_generation bigint DEFAULT 0 NOT NULL,
    outcome_reason text,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    finished_at timestamp with time zone,
    shadow boolean DEFAULT false NOT NULL,
    retry_at timestamp with time zone,
    contradicted_at timestamp with time zone,
    contradiction text,
    CONSTRAINT agent_command_claim_complete CHECK (((state <> 'dispatching'::text) OR ((claim_token IS NOT NULL) AND (lease_until IS NOT NULL)))),
    CONSTRAINT agent_command_contradiction_complete CHECK (((contradicted_at IS NULL) = (contradiction IS NULL))),
    CONSTRAINT agent_command_hash_len CHECK ((octet_length(request_hash) = 32)),
    CONSTRAINT agent_command_payload_kept_or_purged CHECK (((payload_ciphertext IS NULL) <> (payload_purged_at IS NULL))),
    CONSTRAINT agent_command_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'dispatching'::text, 'succeeded'::text, 'denied'::text, 'expired'::text, 'unknown'::text, 'review_required'::text, 'failed'::text]))),
    CONSTRAINT agent_command_success_has_receipt CHECK (((state <> 'succeeded'::text) OR (provider_receipt IS NOT NULL)))
)
WITH (fillfactor='80');

ALTER TABLE ONLY public.agent_command FORCE ROW LEVEL SECURITY;

--
-- Name: agentledger_migrations; Type: TABLE; Schema: public
--

CREATE TABLE public.agentledger_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: approval_notification; Type: TABLE; Schema: public
--

CREATE TABLE public.approval_notification (
    idempotency_key text NOT NULL,
    tenant_id uuid NOT NULL,
    approval_id uuid NOT NULL,
    kind text NOT NULL,
    group_name text NOT NULL,
    recipient text NOT NULL,
    channel text NOT NULL,
    address text NOT NULL,
    message jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    sent_at timestamp with time zone,
    CONSTRAINT approval_notification_address_check CHECK (((length(address) >= 1) AND (length(address) <= 2000))),
    CONSTRAINT approval_notification_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT approval_notification_channel_check CHECK (((length(channel) >= 1) AND (length(channel) <= 64))),
    CONSTRAINT approval_notification_group_name_check CHECK (((length(group_name) >= 1) AND (length(group_name) <= 64))),
    CONSTRAINT approval_notification_idempotency_key_check CHECK (((length(idempotency_key) >= 1) AND (length(idempotency_key) <= 200))),
    CONSTRAINT approval_notification_kind_check CHECK ((kind = ANY (ARRAY['requested'::text, 'escalated'::text, 'expired'::text]))),
    CONSTRAINT approval_notification_last_error_check CHECK ((length(last_error) <= 500)),
    CONSTRAINT approval_notification_lease_owner_check CHECK (((length(lease_owner) >= 1) AND (length(lease_owner) <= 200))),
    CONSTRAINT approval_notification_recipient_check CHECK (((length(recipient) >= 1) AND (length(recipient) <= 200))),
    CONSTRAINT approval_notification_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'sent'::text, 'failed'::text, 'cancelled'::text])))
);

ALTER TABLE ONLY public.approval_notification FORCE ROW LEVEL SECURITY;

--
-- Name: approval_request; Type: TABLE; Schema: public
--

CREATE TABLE public.approval_request (
    approval_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    proposal_id uuid NOT NULL,
    principal_id text NOT NULL,
    action text NOT NULL,
    connector text NOT NULL,
    resource_id text NOT NULL,
    expected_revision text,
    request_hash bytea NOT NULL,
    payload_ciphertext bytea,
    payload_key_version integer,
    policy_version text NOT NULL,
    allowlist_version text NOT NULL,
    decision_id uuid NOT NULL,
    risk text NOT NULL,
    evidence jsonb DEFAULT '[]'::jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    decided_by text,
    decided_at timestamp with time zone,
    decision_reason text,
    approval_decision_id uuid,
    shown_hash bytea,
    superseded_by uuid,
    traceparent text,
    tracestate text,
    evidence_ciphertext bytea,
    evidence_key_version integer,
    payload_purged_at timestamp with time zone,
    required_approvals integer DEFAULT 1 NOT NULL,
    approver_role text,
    quorum_rule text,
    escalated_at timestamp with time zone,
    escalated_to text,
    narrowed_from uuid,
    CONSTRAINT approval_request_approver_role_check CHECK (((length(approver_role) >= 1) AND (length(approver_role) <= 100))),
    CONSTRAINT approval_request_check CHECK (((state = 'pending'::text) OR (decided_at IS NOT NULL))),
    CONSTRAINT approval_request_escalated_to_check CHECK (((length(escalated_to) >= 1) AND (length(escalated_to) <= 64))),
    CONSTRAINT approval_request_payload_kept CHECK (((state <> 'pending'::text) OR ((payload_ciphertext IS NOT NULL) AND (payload_key_version IS NOT NULL)))),
    CONSTRAINT approval_request_quorum_rule_check CHECK (((length(quorum_rule) >= 1) AND (length(quorum_rule) <= 64))),
    CONSTRAINT approval_request_request_hash_check CHECK ((octet_length(request_hash) = 32)),
    CONSTRAINT approval_request_required_approvals_check CHECK (((required_approvals >= 1) AND (required_approvals <= 20))),
    CONSTRAINT approval_request_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'approved'::text, 'denied'::text, 'expired'::text, 'superseded'::text, 'narrowed'::text])))
);

ALTER TABLE ONLY public.approval_request FORCE ROW LEVEL SECURITY;

--
-- Name: approval_vote; Type: TABLE; Schema: public
--

CREATE TABLE public.approval_vote (
    tenant_id uuid NOT NULL,
    approval_id uuid NOT NULL,
    approver text NOT NULL,
    request_hash bytea NOT NULL,
    decision_id uuid NOT NULL,
    voted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT approval_vote_approver_check CHECK (((length(approver) >= 1) AND (length(approver) <= 200)))
);

ALTER TABLE ONLY public.approval_vote FORCE ROW LEVEL SECURITY;

--
-- Name: audit_checkpoint; Type: TABLE; Schema: public
--

CREATE TABLE public.audit_checkpoint (
    tenant_id uuid NOT NULL,
    tree_size bigint NOT NULL,
    root_hash bytea NOT NULL,
    last_seq bigint NOT NULL,
    key_id text NOT NULL,
    signed_at timestamp with time zone NOT NULL,
    body text NOT NULL,
    signature bytea NOT NULL,
    frontier bytea[] NOT NULL,
    CONSTRAINT audit_checkpoint_root_hash_check CHECK ((octet_length(root_hash) = 32)),
    CONSTRAINT audit_checkpoint_signature_check CHECK ((octet_length(signature) = 64)),
    CONSTRAINT audit_checkpoint_tree_size_check CHECK ((tree_size > 0))
);

ALTER TABLE ONLY public.audit_checkpoint FORCE ROW LEVEL SECURITY;

--
-- Name: audit_event; Type: TABLE; Schema: public
--

CREATE TABLE public.audit_event (
    event_id uuid NOT NULL,
    seq bigint NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid,
    type text NOT NULL,
    payload jsonb NOT NULL,
    traceparent text,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    leaf_hash bytea NOT NULL,
    CONSTRAINT audit_event_leaf_hash_size CHECK ((octet_length(leaf_hash) = 32))
);

ALTER TABLE ONLY public.audit_event FORCE ROW LEVEL SECURITY;

--
-- Name: audit_event_seq_seq; Type: SEQUENCE; Schema: public
--

ALTER TABLE public.audit_event ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.audit_event_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: audit_log; Type: TABLE; Schema: public
--

CREATE TABLE public.audit_log (
    tenant_id uuid NOT NULL,
    idx bigint NOT NULL,
    seq bigint NOT NULL,
    leaf_hash bytea NOT NULL,
    CONSTRAINT audit_log_idx_check CHECK ((idx >= 0)),
    CONSTRAINT audit_log_leaf_hash_check CHECK ((octet_length(leaf_hash) = 32))
);

ALTER TABLE ONLY public.audit_log FORCE ROW LEVEL SECURITY;

--
-- Name: audit_notary_cursor; Type: TABLE; Schema: public
--

CREATE TABLE public.audit_notary_cursor (
    singleton boolean DEFAULT true NOT NULL,
    last_seq bigint NOT NULL,
    CONSTRAINT audit_notary_cursor_singleton_check CHECK (singleton)
);

--
-- Name: budget; Type: TABLE; Schema: public
--

CREATE TABLE public.budget (
    tenant_id uuid NOT NULL,
    workflow_id text NOT NULL,
    kind text NOT NULL,
    limit_amount bigint NOT NULL,
    reserved bigint DEFAULT 0 NOT NULL,
    used bigint DEFAULT 0 NOT NULL,
    deadline timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT budget_kind_check CHECK ((kind = ANY (ARRAY['model_tokens'::text, 'tool_calls'::text, 'concurrent_steps'::text]))),
    CONSTRAINT budget_limit_amount_check CHECK ((limit_amount >= 0)),
    CONSTRAINT budget_remaining_not_negative CHECK (((reserved + used) <= limit_amount)),
    CONSTRAINT budget_reserved_check CHECK ((reserved >= 0)),
    CONSTRAINT budget_used_check CHECK ((used >= 0)),
    CONSTRAINT budget_workflow_id_check CHECK (((length(workflow_id) >= 1) AND (length(workflow_id) <= 200)))
)
WITH (fillfactor='80');

ALTER TABLE ONLY public.budget FORCE ROW LEVEL SECURITY;

--
-- Name: budget_charge; Type: TABLE; Schema: public
--

CREATE TABLE public.budget_charge (
    charge_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    budget text NOT NULL,
    scope text NOT NULL,
    scope_key text NOT NULL,
    window_kind text NOT NULL,
    window_start timestamp with time zone,
    unit text NOT NULL,
    currency text,
    amount bigint NOT NULL,
    limit_amount bigint NOT NULL,
    state text DEFAULT 'reserved'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    settled_at timestamp with time zone,
    CONSTRAINT budget_charge_amount_check CHECK ((amount > 0)),
    CONSTRAINT budget_charge_budget_check CHECK (((length(budget) >= 1) AND (length(budget) <= 64))),
    CONSTRAINT budget_charge_currency_check CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT budget_charge_limit_amount_check CHECK ((limit_amount >= 0)),
    CONSTRAINT budget_charge_scope_check CHECK ((scope = ANY (ARRAY['run'::text, 'principal'::text, 'tenant'::text]))),
    CONSTRAINT budget_charge_scope_key_check CHECK (((length(scope_key) >= 1) AND (length(scope_key) <= 200))),
    CONSTRAINT budget_charge_settled CHECK (((state = 'reserved'::text) = (settled_at IS NULL))),
    CONSTRAINT budget_charge_state_check CHECK ((state = ANY (ARRAY['reserved'::text, 'settled'::text, 'released'::text]))),
    CONSTRAINT budget_charge_unit_check CHECK ((unit = ANY (ARRAY['calls'::text, 'tokens'::text, 'amount'::text]))),
    CONSTRAINT budget_charge_window CHECK (((window_kind = 'call'::text) = (window_start IS NULL))),
    CONSTRAINT budget_charge_window_kind_check CHECK ((window_kind = ANY (ARRAY['call'::text, 'hour'::text, 'day'::text])))
);

ALTER TABLE ONLY public.budget_charge FORCE ROW LEVEL SECURITY;

--
-- Name: budget_default; Type: TABLE; Schema: public
--

CREATE TABLE public.budget_default (
    tenant_id uuid NOT NULL,
    kind text NOT NULL,
    limit_amount bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT budget_default_kind_check CHECK ((kind = ANY (ARRAY['model_tokens'::text, 'tool_calls'::text, 'concurrent_steps'::text]))),
    CONSTRAINT budget_default_limit_amount_check CHECK ((limit_amount > 0))
);

ALTER TABLE ONLY public.budget_default FORCE ROW LEVEL SECURITY;

--
-- Name: budget_reservation; Type: TABLE; Schema: public
--

CREATE TABLE public.budget_reservation (
    reservation_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    workflow_id text NOT NULL,
    kind text NOT NULL,
    amount bigint NOT NULL,
    used_amount bigint,
    state text DEFAULT 'reserved'::text NOT NULL,
    operation_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    settled_at timestamp with time zone,
    CONSTRAINT budget_reservation_amount_check CHECK ((amount > 0)),
    CONSTRAINT budget_reservation_settled CHECK ((((state = 'reserved'::text) = (settled_at IS NULL)) AND ((state = 'reserved'::text) = (used_amount IS NULL)))),
    CONSTRAINT budget_reservation_state_check CHECK ((state = ANY (ARRAY['reserved'::text, 'committed'::text, 'released'::text]))),
    CONSTRAINT budget_reservation_used_within CHECK (((used_amount >= 0) AND (used_amount <= amount)))
);

ALTER TABLE ONLY public.budget_reservation FORCE ROW LEVEL SECURITY;

--
-- Name: budget_window; Type: TABLE; Schema: public
--

CREATE TABLE public.budget_window (
    tenant_id uuid NOT NULL,
    budget text NOT NULL,
    scope_key text NOT NULL,
    window_start timestamp with time zone NOT NULL,
    limit_amount bigint NOT NULL,
    reserved bigint DEFAULT 0 NOT NULL,
    used bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT budget_window_budget_check CHECK (((length(budget) >= 1) AND (length(budget) <= 64))),
    CONSTRAINT budget_window_limit_amount_check CHECK ((limit_amount >= 0)),
    CONSTRAINT budget_window_reserved_check CHECK ((reserved >= 0)),
    CONSTRAINT budget_window_scope_key_check CHECK (((length(scope_key) >= 1) AND (length(scope_key) <= 200))),
    CONSTRAINT budget_window_used_check CHECK ((used >= 0))
);

ALTER TABLE ONLY public.budget_window FORCE ROW LEVEL SECURITY;

--
-- Name: command_attempt; Type: TABLE; Schema: public
--

CREATE TABLE public.command_attempt (
    attempt_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    fencing_generation bigint NOT NULL,
    worker_id text NOT NULL,
    kind text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    result text,
    detail text,
    traceparent text,
    sent_at timestamp with time zone,
    late_answer text,
    late_receipt text,
    late_at timestamp with time zone,
    call_bound_s double precision,
    CONSTRAINT command_attempt_call_bound_positive CHECK (((call_bound_s IS NULL) OR (call_bound_s > (0)::double precision))),
    CONSTRAINT command_attempt_kind_check CHECK ((kind = ANY (ARRAY['dispatch'::text, 'lookup'::text, 'resend'::text]))),
    CONSTRAINT command_attempt_late_answer_check CHECK ((late_answer = ANY (ARRAY['applied'::text, 'precondition_failed'::text, 'refused'::text, 'fenced'::text, 'not_sent'::text, 'in_doubt'::text]))),
    CONSTRAINT command_attempt_late_applied_has_receipt CHECK (((late_answer IS DISTINCT FROM 'applied'::text) OR (late_receipt IS NOT NULL))),
    CONSTRAINT command_attempt_late_complete CHECK (((late_answer IS NULL) = (late_at IS NULL))),
    CONSTRAINT command_attempt_result_check CHECK ((result = ANY (ARRAY['succeeded'::text, 'denied'::text, 'expired'::text, 'unknown'::text, 'review_required'::text, 'failed'::text, 'error'::text, 'abandoned'::text, 'fenced'::text, 'late'::text])))
)
WITH (fillfactor='80');

ALTER TABLE ONLY public.command_attempt FORCE ROW LEVEL SECURITY;

--
-- Name: command_outbox; Type: TABLE; Schema: public
--

CREATE TABLE public.command_outbox (
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text DEFAULT 'command.admitted'::text NOT NULL,
    payload jsonb NOT NULL,
    traceparent text,
    tracestate text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.command_outbox FORCE ROW LEVEL SECURITY;

--
-- Name: command_resolution; Type: TABLE; Schema: public
--

CREATE TABLE public.command_resolution (
    resolution_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid NOT NULL,
    resolved_by text NOT NULL,
    resolved_at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text NOT NULL,
    receipt text,
    reason text NOT NULL,
    evidence text,
    provisional boolean DEFAULT false NOT NULL,
    CONSTRAINT command_resolution_check CHECK (((outcome <> 'succeeded'::text) OR (receipt IS NOT NULL))),
    CONSTRAINT command_resolution_outcome_check CHECK ((outcome = ANY (ARRAY['succeeded'::text, 'failed'::text])))
);

ALTER TABLE ONLY public.command_resolution FORCE ROW LEVEL SECURITY;

--
-- Name: event_outbox; Type: TABLE; Schema: public
--

CREATE TABLE public.event_outbox (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    operation_id uuid,
    aggregatetype text NOT NULL,
    aggregateid text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    traceparent text,
    tracestate text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_outbox_aggregatetype_check CHECK ((aggregatetype = ANY (ARRAY['audit'::text, 'outcome'::text])))
);

ALTER TABLE ONLY public.event_outbox FORCE ROW LEVEL SECURITY;

--
-- Name: policy_decision; Type: TABLE; Schema: public
--

CREATE TABLE public.policy_decision (
    decision_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    principal_id text NOT NULL,
    action text NOT NULL,
    resource_id text NOT NULL,
    effect text NOT NULL,
    policy_version text NOT NULL,
    reasons jsonb DEFAULT '[]'::jsonb NOT NULL,
    reason text NOT NULL,
    stage text DEFAULT 'admission'::text NOT NULL,
    operation_id uuid,
    decided_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT policy_decision_effect_check CHECK ((effect = ANY (ARRAY['allow'::text, 'require_approval'::text, 'deny'::text]))),
    CONSTRAINT policy_decision_reasons_check CHECK ((jsonb_typeof(reasons) = 'array'::text)),
    CONSTRAINT policy_decision_stage_check CHECK ((stage = ANY (ARRAY['admission'::text, 'approval'::text, 'dispatch'::text])))
);

ALTER TABLE ONLY public.policy_decision FORCE ROW LEVEL SECURITY;

--
-- Name: principal; Type: TABLE; Schema: public
--

CREATE TABLE public.principal (
    tenant_id uuid NOT NULL,
    principal_id text NOT NULL,
    roles jsonb DEFAULT '[]'::jsonb NOT NULL,
    revoked_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT principal_principal_id_check CHECK (((length(principal_id) >= 1) AND (length(principal_id) <= 200))),
    CONSTRAINT principal_roles_check CHECK (((jsonb_typeof(roles) = 'array'::text) AND (jsonb_array_length(roles) <= 32)))
);

ALTER TABLE ONLY public.principal FORCE ROW LEVEL SECURITY;

--
-- Name: tenant_data_key; Type: TABLE; Schema: public
--

CREATE TABLE public.tenant_data_key (
    tenant_id uuid NOT NULL,
    key_version integer NOT NULL,
    wrapped_key bytea NOT NULL,
    master_key_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.tenant_data_key FORCE ROW LEVEL SECURITY;

--
-- Name: agent_command agent_command_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.agent_command
    ADD CONSTRAINT agent_command_pkey PRIMARY KEY (tenant_id, operation_id);

--
-- Name: agentledger_migrations agentledger_migrations_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.agentledger_migrations
    ADD CONSTRAINT agentledger_migrations_pkey PRIMARY KEY (version);

--
-- Name: approval_notification approval_notification_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_notification
    ADD CONSTRAINT approval_notification_pkey PRIMARY KEY (idempotency_key);

--
-- Name: approval_request approval_request_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_request
    ADD CONSTRAINT approval_request_pkey PRIMARY KEY (approval_id);

--
-- Name: approval_vote approval_vote_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_vote
    ADD CONSTRAINT approval_vote_pkey PRIMARY KEY (tenant_id, approval_id, approver);

--
-- Name: audit_checkpoint audit_checkpoint_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.audit_checkpoint
    ADD CONSTRAINT audit_checkpoint_pkey PRIMARY KEY (tenant_id, tree_size);

--
-- Name: audit_event audit_event_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.audit_event
    ADD CONSTRAINT audit_event_pkey PRIMARY KEY (event_id);

--
-- Name: audit_log audit_log_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.audit_log
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (tenant_id, idx);

--
-- Name: audit_notary_cursor audit_notary_cursor_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.audit_notary_cursor
    ADD CONSTRAINT audit_notary_cursor_pkey PRIMARY KEY (singleton);

--
-- Name: budget_charge budget_charge_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget_charge
    ADD CONSTRAINT budget_charge_pkey PRIMARY KEY (charge_id);

--
-- Name: budget_default budget_default_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget_default
    ADD CONSTRAINT budget_default_pkey PRIMARY KEY (tenant_id, kind);

--
-- Name: budget budget_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget
    ADD CONSTRAINT budget_pkey PRIMARY KEY (tenant_id, workflow_id, kind);

--
-- Name: budget_reservation budget_reservation_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget_reservation
    ADD CONSTRAINT budget_reservation_pkey PRIMARY KEY (reservation_id);

--
-- Name: budget_window budget_window_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget_window
    ADD CONSTRAINT budget_window_pkey PRIMARY KEY (tenant_id, budget, scope_key, window_start);

--
-- Name: command_attempt command_attempt_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_attempt
    ADD CONSTRAINT command_attempt_pkey PRIMARY KEY (attempt_id);

--
-- Name: command_outbox command_outbox_id_key; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_outbox
    ADD CONSTRAINT command_outbox_id_key UNIQUE (id);

--
-- Name: command_outbox command_outbox_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_outbox
    ADD CONSTRAINT command_outbox_pkey PRIMARY KEY (tenant_id, operation_id);

--
-- Name: command_resolution command_resolution_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_resolution
    ADD CONSTRAINT command_resolution_pkey PRIMARY KEY (resolution_id);

--
-- Name: event_outbox event_outbox_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.event_outbox
    ADD CONSTRAINT event_outbox_pkey PRIMARY KEY (id);

--
-- Name: policy_decision policy_decision_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.policy_decision
    ADD CONSTRAINT policy_decision_pkey PRIMARY KEY (decision_id);

--
-- Name: principal principal_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.principal
    ADD CONSTRAINT principal_pkey PRIMARY KEY (tenant_id, principal_id);

--
-- Name: tenant_data_key tenant_data_key_pkey; Type: CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.tenant_data_key
    ADD CONSTRAINT tenant_data_key_pkey PRIMARY KEY (tenant_id, key_version);

--
-- Name: agent_command_pending_age; Type: INDEX; Schema: public
--

CREATE INDEX agent_command_pending_age ON public.agent_command USING btree (updated_at) WHERE (state = 'pending'::text);

--
-- Name: agent_command_recoverable; Type: INDEX; Schema: public
--

CREATE INDEX agent_command_recoverable ON public.agent_command USING btree (state, lease_until) WHERE (state = ANY (ARRAY['dispatching'::text, 'unknown'::text]));

--
-- Name: approval_notification_by_approval; Type: INDEX; Schema: public
--

CREATE INDEX approval_notification_by_approval ON public.approval_notification USING btree (approval_id);

--
-- Name: approval_notification_due; Type: INDEX; Schema: public
--

CREATE INDEX approval_notification_due ON public.approval_notification USING btree (next_attempt_at) WHERE (state = 'pending'::text);

--
-- Name: approval_request_escalation_due; Type: INDEX; Schema: public
--

CREATE INDEX approval_request_escalation_due ON public.approval_request USING btree (created_at) WHERE ((state = 'pending'::text) AND (escalated_at IS NULL) AND (quorum_rule IS NOT NULL));

--
-- Name: approval_request_narrowed_once; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX approval_request_narrowed_once ON public.approval_request USING btree (narrowed_from) WHERE (narrowed_from IS NOT NULL);

--
-- Name: approval_request_one_pending; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX approval_request_one_pending ON public.approval_request USING btree (tenant_id, operation_id) WHERE (state = 'pending'::text);

--
-- Name: approval_request_operation; Type: INDEX; Schema: public
--

CREATE INDEX approval_request_operation ON public.approval_request USING btree (tenant_id, operation_id, proposal_id);

--
-- Name: approval_request_pending; Type: INDEX; Schema: public
--

CREATE INDEX approval_request_pending ON public.approval_request USING btree (tenant_id, created_at) WHERE (state = 'pending'::text);

--
-- Name: audit_event_by_operation; Type: INDEX; Schema: public
--

CREATE INDEX audit_event_by_operation ON public.audit_event USING btree (tenant_id, operation_id, seq);

--
-- Name: audit_event_seq_brin; Type: INDEX; Schema: public
--

CREATE INDEX audit_event_seq_brin ON public.audit_event USING brin (seq);

--
-- Name: budget_charge_once; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX budget_charge_once ON public.budget_charge USING btree (tenant_id, operation_id, budget) WHERE (state <> 'released'::text);

--
-- Name: budget_reservation_by_operation; Type: INDEX; Schema: public
--

CREATE INDEX budget_reservation_by_operation ON public.budget_reservation USING btree (tenant_id, operation_id) WHERE (operation_id IS NOT NULL);

--
-- Name: budget_reservation_one_open_per_operation; Type: INDEX; Schema: public
--

CREATE UNIQUE INDEX budget_reservation_one_open_per_operation ON public.budget_reservation USING btree (tenant_id, workflow_id, kind, operation_id) WHERE ((state = 'reserved'::text) AND (operation_id IS NOT NULL));

--
-- Name: command_attempt_by_command; Type: INDEX; Schema: public
--

CREATE INDEX command_attempt_by_command ON public.command_attempt USING btree (tenant_id, operation_id, started_at);

--
-- Name: command_attempt_late_applied; Type: INDEX; Schema: public
--

CREATE INDEX command_attempt_late_applied ON public.command_attempt USING btree (tenant_id, operation_id) WHERE (late_answer = 'applied'::text);

--
-- Name: policy_decision_by_operation; Type: INDEX; Schema: public
--

CREATE INDEX policy_decision_by_operation ON public.policy_decision USING btree (tenant_id, operation_id, decided_at);

--
-- Name: audit_checkpoint audit_checkpoint_append_only; Type: TRIGGER; Schema: public
--

CREATE TRIGGER audit_checkpoint_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON public.audit_checkpoint FOR EACH STATEMENT EXECUTE FUNCTION public.agentledger_audit_is_append_only();

--
-- Name: audit_event audit_event_append_only; Type: TRIGGER; Schema: public
--

CREATE TRIGGER audit_event_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON public.audit_event FOR EACH STATEMENT EXECUTE FUNCTION public.agentledger_audit_is_append_only();

--
-- Name: event_outbox audit_event_copy_v3; Type: TRIGGER; Schema: public
--

CREATE TRIGGER audit_event_copy_v3 AFTER INSERT ON public.event_outbox REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT EXECUTE FUNCTION public.agentledger_copy_audit_events_v3();

--
-- Name: audit_log audit_log_append_only; Type: TRIGGER; Schema: public
--

CREATE TRIGGER audit_log_append_only BEFORE DELETE OR UPDATE OR TRUNCATE ON public.audit_log FOR EACH STATEMENT EXECUTE FUNCTION public.agentledger_audit_is_append_only();

--
-- Name: agent_command budget_charge_on_command_end; Type: TRIGGER; Schema: public
--

CREATE TRIGGER budget_charge_on_command_end AFTER UPDATE OF state ON public.agent_command FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) AND (new.state = ANY (ARRAY['succeeded'::text, 'failed'::text, 'denied'::text, 'expired'::text, 'review_required'::text])))) EXECUTE FUNCTION public.agentledger_budget_on_command_end_v1();

--
-- Name: approval_request budget_charge_on_request_end; Type: TRIGGER; Schema: public
--

CREATE TRIGGER budget_charge_on_request_end AFTER UPDATE OF state ON public.approval_request FOR EACH ROW WHEN (((old.state = 'pending'::text) AND (new.state = ANY (ARRAY['denied'::text, 'expired'::text, 'superseded'::text, 'narrowed'::text])))) EXECUTE FUNCTION public.agentledger_budget_on_request_end_v1();

--
-- Name: approval_notification approval_notification_approval_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_notification
    ADD CONSTRAINT approval_notification_approval_id_fkey FOREIGN KEY (approval_id) REFERENCES public.approval_request(approval_id);

--
-- Name: approval_request approval_request_narrowed_from_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_request
    ADD CONSTRAINT approval_request_narrowed_from_fkey FOREIGN KEY (narrowed_from) REFERENCES public.approval_request(approval_id);

--
-- Name: approval_request approval_request_superseded_by_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_request
    ADD CONSTRAINT approval_request_superseded_by_fkey FOREIGN KEY (superseded_by) REFERENCES public.approval_request(approval_id);

--
-- Name: approval_vote approval_vote_approval_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.approval_vote
    ADD CONSTRAINT approval_vote_approval_id_fkey FOREIGN KEY (approval_id) REFERENCES public.approval_request(approval_id);

--
-- Name: budget_reservation budget_reservation_tenant_id_workflow_id_kind_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.budget_reservation
    ADD CONSTRAINT budget_reservation_tenant_id_workflow_id_kind_fkey FOREIGN KEY (tenant_id, workflow_id, kind) REFERENCES public.budget(tenant_id, workflow_id, kind);

--
-- Name: command_attempt command_attempt_tenant_id_operation_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_attempt
    ADD CONSTRAINT command_attempt_tenant_id_operation_id_fkey FOREIGN KEY (tenant_id, operation_id) REFERENCES public.agent_command(tenant_id, operation_id);

--
-- Name: command_outbox command_outbox_tenant_id_operation_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_outbox
    ADD CONSTRAINT command_outbox_tenant_id_operation_id_fkey FOREIGN KEY (tenant_id, operation_id) REFERENCES public.agent_command(tenant_id, operation_id);

--
-- Name: command_resolution command_resolution_tenant_id_operation_id_fkey; Type: FK CONSTRAINT; Schema: public
--

ALTER TABLE ONLY public.command_resolution
    ADD CONSTRAINT command_resolution_tenant_id_operation_id_fkey FOREIGN KEY (tenant_id, operation_id) REFERENCES public.agent_command(tenant_id, operation_id);

--
-- Name: agent_command; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.agent_command ENABLE ROW LEVEL SECURITY;

--
-- Name: approval_notification; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.approval_notification ENABLE ROW LEVEL SECURITY;

--
-- Name: approval_request; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.approval_request ENABLE ROW LEVEL SECURITY;

--
-- Name: approval_vote; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.approval_vote ENABLE ROW LEVEL SECURITY;

--
-- Name: audit_checkpoint; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.audit_checkpoint ENABLE ROW LEVEL SECURITY;

--
-- Name: audit_event audit_copy; Type: POLICY; Schema: public
--

CREATE POLICY audit_copy ON public.audit_event FOR INSERT TO agentledger_audit_writer WITH CHECK (true);

--
-- Name: audit_event; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.audit_event ENABLE ROW LEVEL SECURITY;

--
-- Name: audit_log; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.audit_log ENABLE ROW LEVEL SECURITY;

--
-- Name: budget; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.budget ENABLE ROW LEVEL SECURITY;

--
-- Name: event_outbox budget_audit; Type: POLICY; Schema: public
--

CREATE POLICY budget_audit ON public.event_outbox TO agentledger_budget_keeper USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget_charge; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.budget_charge ENABLE ROW LEVEL SECURITY;

--
-- Name: budget_charge budget_counter; Type: POLICY; Schema: public
--

CREATE POLICY budget_counter ON public.budget_charge TO agentledger_budget_counter USING (true) WITH CHECK (true);

--
-- Name: budget_window budget_counter; Type: POLICY; Schema: public
--

CREATE POLICY budget_counter ON public.budget_window TO agentledger_budget_counter USING (true) WITH CHECK (true);

--
-- Name: event_outbox budget_counter_audit; Type: POLICY; Schema: public
--

CREATE POLICY budget_counter_audit ON public.event_outbox FOR INSERT TO agentledger_budget_counter WITH CHECK (((aggregatetype = 'audit'::text) AND (type = 'budget.exhausted'::text) AND (tenant_id = public.agentledger_current_tenant())));

--
-- Name: budget_default; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.budget_default ENABLE ROW LEVEL SECURITY;

--
-- Name: budget_reservation; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.budget_reservation ENABLE ROW LEVEL SECURITY;

--
-- Name: budget_window; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.budget_window ENABLE ROW LEVEL SECURITY;

--
-- Name: command_attempt; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.command_attempt ENABLE ROW LEVEL SECURITY;

--
-- Name: command_outbox; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.command_outbox ENABLE ROW LEVEL SECURITY;

--
-- Name: command_resolution; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.command_resolution ENABLE ROW LEVEL SECURITY;

--
-- Name: event_outbox; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.event_outbox ENABLE ROW LEVEL SECURITY;

--
-- Name: audit_checkpoint notary_appends; Type: POLICY; Schema: public
--

CREATE POLICY notary_appends ON public.audit_checkpoint TO agentledger_notary USING (true) WITH CHECK (true);

--
-- Name: audit_log notary_appends; Type: POLICY; Schema: public
--

CREATE POLICY notary_appends ON public.audit_log TO agentledger_notary USING (true) WITH CHECK (true);

--
-- Name: event_outbox notary_publishes; Type: POLICY; Schema: public
--

CREATE POLICY notary_publishes ON public.event_outbox FOR INSERT TO agentledger_notary WITH CHECK (((aggregatetype = 'audit'::text) AND (type = 'log.checkpoint'::text) AND (operation_id IS NULL)));

--
-- Name: audit_event notary_reads; Type: POLICY; Schema: public
--

CREATE POLICY notary_reads ON public.audit_event FOR SELECT TO agentledger_notary USING (true);

--
-- Name: event_outbox notifier_audits; Type: POLICY; Schema: public
--

CREATE POLICY notifier_audits ON public.event_outbox FOR INSERT TO agentledger_notifier WITH CHECK (((aggregatetype = 'audit'::text) AND (type ~~ 'approval.%'::text)));

--
-- Name: approval_request notifier_escalates; Type: POLICY; Schema: public
--

CREATE POLICY notifier_escalates ON public.approval_request FOR UPDATE TO agentledger_notifier USING (((state = 'pending'::text) AND (escalated_at IS NULL))) WITH CHECK ((state = 'pending'::text));

--
-- Name: approval_request notifier_reads; Type: POLICY; Schema: public
--

CREATE POLICY notifier_reads ON public.approval_request FOR SELECT TO agentledger_notifier USING (true);

--
-- Name: approval_notification notifier_sends; Type: POLICY; Schema: public
--

CREATE POLICY notifier_sends ON public.approval_notification TO agentledger_notifier USING (true) WITH CHECK (true);

--
-- Name: policy_decision; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.policy_decision ENABLE ROW LEVEL SECURITY;

--
-- Name: principal; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.principal ENABLE ROW LEVEL SECURITY;

--
-- Name: command_outbox relay_sweep; Type: POLICY; Schema: public
--

CREATE POLICY relay_sweep ON public.command_outbox TO agentledger_relay USING (true);

--
-- Name: event_outbox relay_sweep; Type: POLICY; Schema: public
--

CREATE POLICY relay_sweep ON public.event_outbox TO agentledger_relay USING (true);

--
-- Name: command_outbox requeue; Type: POLICY; Schema: public
--

CREATE POLICY requeue ON public.command_outbox TO agentledger_executor, agentledger_reconciler USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: agent_command retention_purge; Type: POLICY; Schema: public
--

CREATE POLICY retention_purge ON public.agent_command TO agentledger_maintenance USING (true);

--
-- Name: approval_request retention_purge; Type: POLICY; Schema: public
--

CREATE POLICY retention_purge ON public.approval_request TO agentledger_maintenance USING ((state <> 'pending'::text)) WITH CHECK ((state <> 'pending'::text));

--
-- Name: event_outbox sweeper_audit; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_audit ON public.event_outbox FOR INSERT TO agentledger_sweeper WITH CHECK (((aggregatetype = 'audit'::text) AND (type = 'approval.expired'::text)));

--
-- Name: command_attempt sweeper_close_attempts; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_close_attempts ON public.command_attempt FOR UPDATE TO agentledger_sweeper USING ((finished_at IS NULL)) WITH CHECK ((result = 'abandoned'::text));

--
-- Name: agent_command sweeper_end_leases; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_end_leases ON public.agent_command FOR UPDATE TO agentledger_sweeper USING ((state = 'dispatching'::text)) WITH CHECK ((state = 'dispatching'::text));

--
-- Name: approval_request sweeper_expire; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_expire ON public.approval_request FOR UPDATE TO agentledger_sweeper USING (((state = 'pending'::text) AND (expires_at <= now()))) WITH CHECK ((state = 'expired'::text));

--
-- Name: approval_request sweeper_read; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_read ON public.approval_request FOR SELECT TO agentledger_sweeper USING (true);

--
-- Name: command_attempt sweeper_read_attempts; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_read_attempts ON public.command_attempt FOR SELECT TO agentledger_sweeper USING (true);

--
-- Name: agent_command sweeper_search; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_search ON public.agent_command FOR SELECT TO agentledger_sweeper USING (true);

--
-- Name: command_outbox sweeper_search; Type: POLICY; Schema: public
--

CREATE POLICY sweeper_search ON public.command_outbox FOR SELECT TO agentledger_sweeper USING (true);

--
-- Name: tenant_data_key; Type: ROW SECURITY; Schema: public
--

ALTER TABLE public.tenant_data_key ENABLE ROW LEVEL SECURITY;

--
-- Name: agent_command tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.agent_command TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: approval_notification tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.approval_notification TO agentledger_admission, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: approval_request tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.approval_request TO agentledger_admission, agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: approval_vote tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.approval_vote TO agentledger_admission, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: audit_checkpoint tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.audit_checkpoint FOR SELECT TO agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: audit_event tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.audit_event TO agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: audit_log tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.audit_log FOR SELECT TO agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.budget TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor, agentledger_budget_keeper USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget_charge tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.budget_charge TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget_default tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.budget_default TO agentledger_auditor, agentledger_budget_keeper USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget_reservation tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.budget_reservation TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor, agentledger_budget_keeper USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: budget_window tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.budget_window TO agentledger_admission, agentledger_executor, agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: command_attempt tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.command_attempt TO agentledger_executor, agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: command_outbox tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.command_outbox TO agentledger_admission USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: command_resolution tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.command_resolution TO agentledger_reconciler, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: event_outbox tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.event_outbox TO agentledger_admission, agentledger_executor, agentledger_reconciler USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: policy_decision tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.policy_decision TO agentledger_admission, agentledger_executor, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: principal tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.principal TO agentledger_admission, agentledger_executor, agentledger_auditor USING ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: tenant_data_key tenant_isolation; Type: POLICY; Schema: public
--

CREATE POLICY tenant_isolation ON public.tenant_data_key TO agentledger_admission, agentledger_executor, agentledger_reconciler USING ((tenant_id = public.agentledger_current_tenant())) WITH CHECK ((tenant_id = public.agentledger_current_tenant()));

--
-- Name: agentledger_outbox; Type: PUBLICATION; Schema: -
--

CREATE PUBLICATION agentledger_outbox WITH (publish = 'insert');

--
-- Name: agentledger_outbox command_outbox; Type: PUBLICATION TABLE; Schema: public
--

ALTER PUBLICATION agentledger_outbox ADD TABLE ONLY public.command_outbox;

--
-- Name: agentledger_outbox event_outbox; Type: PUBLICATION TABLE; Schema: public
--

ALTER PUBLICATION agentledger_outbox ADD TABLE ONLY public.event_outbox;

--
-- Name: FUNCTION agentledger_admitted_hash(tenant uuid, operation uuid); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_admitted_hash(tenant uuid, operation uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_admitted_hash(tenant uuid, operation uuid) TO agentledger_ingress;

--
-- Name: FUNCTION agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb); Type: ACL; Schema: public; Owner: agentledger_budget_counter
--

REVOKE ALL ON FUNCTION public.agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_budget_charge_v1(p_tenant uuid, p_operation uuid, p_charges jsonb) TO agentledger_admission;

--
-- Name: FUNCTION agentledger_budget_on_command_end_v1(); Type: ACL; Schema: public; Owner: agentledger_budget_counter
--

REVOKE ALL ON FUNCTION public.agentledger_budget_on_command_end_v1() FROM PUBLIC;

--
-- Name: FUNCTION agentledger_budget_on_request_end_v1(); Type: ACL; Schema: public; Owner: agentledger_budget_counter
--

REVOKE ALL ON FUNCTION public.agentledger_budget_on_request_end_v1() FROM PUBLIC;

--
-- Name: FUNCTION agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text); Type: ACL; Schema: public; Owner: agentledger_budget_keeper
--

REVOKE ALL ON FUNCTION public.agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text) TO agentledger_planner;
GRANT ALL ON FUNCTION public.agentledger_budget_open_default(p_tenant uuid, p_workflow text, p_kind text) TO agentledger_admission;

--
-- Name: FUNCTION agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid); Type: ACL; Schema: public; Owner: agentledger_budget_keeper
--

REVOKE ALL ON FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) TO agentledger_planner;
GRANT ALL ON FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) TO agentledger_admission;
GRANT ALL ON FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) TO agentledger_executor;
GRANT ALL ON FUNCTION public.agentledger_budget_reserve_v2(p_tenant uuid, p_workflow text, p_kind text, p_amount bigint, p_operation_id uuid) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint); Type: ACL; Schema: public; Owner: agentledger_budget_keeper
--

REVOKE ALL ON FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) TO agentledger_planner;
GRANT ALL ON FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) TO agentledger_admission;
GRANT ALL ON FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) TO agentledger_executor;
GRANT ALL ON FUNCTION public.agentledger_budget_settle(p_tenant uuid, p_reservation_id uuid, p_used bigint) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_budget_settle_charges_v1(p_tenant uuid, p_operation uuid, p_state text); Type: ACL; Schema: public; Owner: agentledger_budget_counter
--

REVOKE ALL ON FUNCTION public.agentledger_budget_settle_charges_v1(p_tenant uuid, p_operation uuid, p_state text) FROM PUBLIC;

--
-- Name: FUNCTION agentledger_copy_audit_events_v3(); Type: ACL; Schema: public; Owner: agentledger_audit_writer
--

REVOKE ALL ON FUNCTION public.agentledger_copy_audit_events_v3() FROM PUBLIC;

--
-- Name: FUNCTION agentledger_end_leases_of_v2(worker text); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_end_leases_of_v2(worker text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_end_leases_of_v2(worker text) TO agentledger_executor;

--
-- Name: FUNCTION agentledger_expire_approvals(max_rows integer); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_expire_approvals(max_rows integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_expire_approvals(max_rows integer) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_late_applied_v1(max_rows integer); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_late_applied_v1(max_rows integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_late_applied_v1(max_rows integer) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_needs_reconciliation_v3(max_rows integer, lookup_connectors text[], max_generations integer); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_needs_reconciliation_v3(max_rows integer, lookup_connectors text[], max_generations integer) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_needs_reconciliation_v3(max_rows integer, lookup_connectors text[], max_generations integer) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_stranded_pending_v2(max_rows integer, older_than interval); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_stranded_pending_v2(max_rows integer, older_than interval) FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_stranded_pending_v2(max_rows integer, older_than interval) TO agentledger_reconciler;

--
-- Name: FUNCTION agentledger_unknown_backlog_v1(); Type: ACL; Schema: public; Owner: agentledger_sweeper
--

REVOKE ALL ON FUNCTION public.agentledger_unknown_backlog_v1() FROM PUBLIC;
GRANT ALL ON FUNCTION public.agentledger_unknown_backlog_v1() TO agentledger_reconciler;

--
-- Name: TABLE agent_command; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.agent_command TO agentledger_admission;
GRANT SELECT ON TABLE public.agent_command TO agentledger_executor;
GRANT SELECT ON TABLE public.agent_command TO agentledger_reconciler;
GRANT SELECT ON TABLE public.agent_command TO agentledger_maintenance;
GRANT SELECT ON TABLE public.agent_command TO agentledger_auditor;
GRANT SELECT ON TABLE public.agent_command TO agentledger_sweeper;

--
-- Name: COLUMN agent_command.state; Type: ACL; Schema: public
--

GRANT UPDATE(state) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(state) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.provider_receipt; Type: ACL; Schema: public
--

GRANT UPDATE(provider_receipt) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(provider_receipt) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.lease_until; Type: ACL; Schema: public
--

GRANT UPDATE(lease_until) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(lease_until) ON TABLE public.agent_command TO agentledger_reconciler;
GRANT UPDATE(lease_until) ON TABLE public.agent_command TO agentledger_sweeper;

--
-- Name: COLUMN agent_command.payload_ciphertext; Type: ACL; Schema: public
--

GRANT UPDATE(payload_ciphertext) ON TABLE public.agent_command TO agentledger_maintenance;

--
-- Name: COLUMN agent_command.payload_key_version; Type: ACL; Schema: public
--

GRANT UPDATE(payload_key_version) ON TABLE public.agent_command TO agentledger_maintenance;

--
-- Name: COLUMN agent_command.payload_purged_at; Type: ACL; Schema: public
--

GRANT UPDATE(payload_purged_at) ON TABLE public.agent_command TO agentledger_maintenance;

--
-- Name: COLUMN agent_command.claim_token; Type: ACL; Schema: public
--

GRANT UPDATE(claim_token) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(claim_token) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.claimed_by; Type: ACL; Schema: public
--

GRANT UPDATE(claimed_by) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(claimed_by) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.fencing_generation; Type: ACL; Schema: public
--

GRANT UPDATE(fencing_generation) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(fencing_generation) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.outcome_reason; Type: ACL; Schema: public
--

GRANT UPDATE(outcome_reason) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(outcome_reason) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.updated_at; Type: ACL; Schema: public
--

GRANT UPDATE(updated_at) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(updated_at) ON TABLE public.agent_command TO agentledger_reconciler;
GRANT UPDATE(updated_at) ON TABLE public.agent_command TO agentledger_maintenance;
GRANT UPDATE(updated_at) ON TABLE public.agent_command TO agentledger_sweeper;

--
-- Name: COLUMN agent_command.dispatched_at; Type: ACL; Schema: public
--

GRANT UPDATE(dispatched_at) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(dispatched_at) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.finished_at; Type: ACL; Schema: public
--

GRANT UPDATE(finished_at) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(finished_at) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.retry_at; Type: ACL; Schema: public
--

GRANT UPDATE(retry_at) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(retry_at) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.contradicted_at; Type: ACL; Schema: public
--

GRANT UPDATE(contradicted_at) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(contradicted_at) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: COLUMN agent_command.contradiction; Type: ACL; Schema: public
--

GRANT UPDATE(contradiction) ON TABLE public.agent_command TO agentledger_executor;
GRANT UPDATE(contradiction) ON TABLE public.agent_command TO agentledger_reconciler;

--
-- Name: TABLE approval_notification; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.approval_notification TO agentledger_admission;
GRANT SELECT ON TABLE public.approval_notification TO agentledger_auditor;
GRANT SELECT,INSERT,UPDATE ON TABLE public.approval_notification TO agentledger_notifier;

--
-- Name: TABLE approval_request; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.approval_request TO agentledger_admission;
GRANT SELECT ON TABLE public.approval_request TO agentledger_auditor;
GRANT SELECT ON TABLE public.approval_request TO agentledger_reconciler;
GRANT SELECT ON TABLE public.approval_request TO agentledger_sweeper;
GRANT SELECT ON TABLE public.approval_request TO agentledger_maintenance;
GRANT SELECT ON TABLE public.approval_request TO agentledger_notifier;

--
-- Name: COLUMN approval_request.payload_ciphertext; Type: ACL; Schema: public
--

GRANT UPDATE(payload_ciphertext) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.payload_key_version; Type: ACL; Schema: public
--

GRANT UPDATE(payload_key_version) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.evidence; Type: ACL; Schema: public
--

GRANT UPDATE(evidence) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.state; Type: ACL; Schema: public
--

GRANT UPDATE(state) ON TABLE public.approval_request TO agentledger_admission;
GRANT UPDATE(state) ON TABLE public.approval_request TO agentledger_sweeper;

--
-- Name: COLUMN approval_request.decided_by; Type: ACL; Schema: public
--

GRANT UPDATE(decided_by) ON TABLE public.approval_request TO agentledger_admission;
GRANT UPDATE(decided_by) ON TABLE public.approval_request TO agentledger_sweeper;

--
-- Name: COLUMN approval_request.decided_at; Type: ACL; Schema: public
--

GRANT UPDATE(decided_at) ON TABLE public.approval_request TO agentledger_admission;
GRANT UPDATE(decided_at) ON TABLE public.approval_request TO agentledger_sweeper;

--
-- Name: COLUMN approval_request.decision_reason; Type: ACL; Schema: public
--

GRANT UPDATE(decision_reason) ON TABLE public.approval_request TO agentledger_admission;
GRANT UPDATE(decision_reason) ON TABLE public.approval_request TO agentledger_sweeper;

--
-- Name: COLUMN approval_request.approval_decision_id; Type: ACL; Schema: public
--

GRANT UPDATE(approval_decision_id) ON TABLE public.approval_request TO agentledger_admission;

--
-- Name: COLUMN approval_request.shown_hash; Type: ACL; Schema: public
--

GRANT UPDATE(shown_hash) ON TABLE public.approval_request TO agentledger_admission;

--
-- Name: COLUMN approval_request.superseded_by; Type: ACL; Schema: public
--

GRANT UPDATE(superseded_by) ON TABLE public.approval_request TO agentledger_admission;

--
-- Name: COLUMN approval_request.evidence_ciphertext; Type: ACL; Schema: public
--

GRANT UPDATE(evidence_ciphertext) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.evidence_key_version; Type: ACL; Schema: public
--

GRANT UPDATE(evidence_key_version) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.payload_purged_at; Type: ACL; Schema: public
--

GRANT UPDATE(payload_purged_at) ON TABLE public.approval_request TO agentledger_maintenance;

--
-- Name: COLUMN approval_request.escalated_at; Type: ACL; Schema: public
--

GRANT UPDATE(escalated_at) ON TABLE public.approval_request TO agentledger_notifier;

--
-- Name: COLUMN approval_request.escalated_to; Type: ACL; Schema: public
--

GRANT UPDATE(escalated_to) ON TABLE public.approval_request TO agentledger_notifier;

--
-- Name: COLUMN approval_request.narrowed_from; Type: ACL; Schema: public
--

GRANT UPDATE(narrowed_from) ON TABLE public.approval_request TO agentledger_admission;

--
-- Name: TABLE approval_vote; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.approval_vote TO agentledger_admission;
GRANT SELECT ON TABLE public.approval_vote TO agentledger_auditor;

--
-- Name: TABLE audit_checkpoint; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.audit_checkpoint TO agentledger_notary;
GRANT SELECT ON TABLE public.audit_checkpoint TO agentledger_auditor;

--
-- Name: TABLE audit_event; Type: ACL; Schema: public
--

GRANT SELECT ON TABLE public.audit_event TO agentledger_auditor;
GRANT INSERT ON TABLE public.audit_event TO agentledger_audit_writer;

--
-- Name: COLUMN audit_event.seq; Type: ACL; Schema: public
--

GRANT SELECT(seq) ON TABLE public.audit_event TO agentledger_notary;

--
-- Name: COLUMN audit_event.tenant_id; Type: ACL; Schema: public
--

GRANT SELECT(tenant_id) ON TABLE public.audit_event TO agentledger_notary;

--
-- Name: COLUMN audit_event.leaf_hash; Type: ACL; Schema: public
--

GRANT SELECT(leaf_hash) ON TABLE public.audit_event TO agentledger_notary;

--
-- Name: TABLE audit_log; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.audit_log TO agentledger_notary;
GRANT SELECT ON TABLE public.audit_log TO agentledger_auditor;

--
-- Name: TABLE audit_notary_cursor; Type: ACL; Schema: public
--

GRANT SELECT,UPDATE ON TABLE public.audit_notary_cursor TO agentledger_notary;
GRANT SELECT ON TABLE public.audit_notary_cursor TO agentledger_auditor;

--
-- Name: TABLE budget; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.budget TO agentledger_admission;
GRANT SELECT ON TABLE public.budget TO agentledger_executor;
GRANT SELECT ON TABLE public.budget TO agentledger_reconciler;
GRANT SELECT ON TABLE public.budget TO agentledger_auditor;
GRANT SELECT,INSERT,UPDATE ON TABLE public.budget TO agentledger_budget_keeper;

--
-- Name: COLUMN budget.used; Type: ACL; Schema: public
--

GRANT UPDATE(used) ON TABLE public.budget TO agentledger_admission;

--
-- Name: COLUMN budget.updated_at; Type: ACL; Schema: public
--

GRANT UPDATE(updated_at) ON TABLE public.budget TO agentledger_admission;

--
-- Name: TABLE budget_charge; Type: ACL; Schema: public
--

GRANT SELECT ON TABLE public.budget_charge TO agentledger_admission;
GRANT SELECT ON TABLE public.budget_charge TO agentledger_executor;
GRANT SELECT ON TABLE public.budget_charge TO agentledger_reconciler;
GRANT SELECT ON TABLE public.budget_charge TO agentledger_auditor;
GRANT SELECT,INSERT,DELETE,UPDATE ON TABLE public.budget_charge TO agentledger_budget_counter;

--
-- Name: TABLE budget_default; Type: ACL; Schema: public
--

GRANT SELECT ON TABLE public.budget_default TO agentledger_budget_keeper;
GRANT SELECT ON TABLE public.budget_default TO agentledger_auditor;

--
-- Name: TABLE budget_reservation; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.budget_reservation TO agentledger_admission;
GRANT SELECT ON TABLE public.budget_reservation TO agentledger_executor;
GRANT SELECT ON TABLE public.budget_reservation TO agentledger_reconciler;
GRANT SELECT ON TABLE public.budget_reservation TO agentledger_auditor;
GRANT SELECT,INSERT,UPDATE ON TABLE public.budget_reservation TO agentledger_budget_keeper;

--
-- Name: TABLE budget_window; Type: ACL; Schema: public
--

GRANT SELECT ON TABLE public.budget_window TO agentledger_admission;
GRANT SELECT ON TABLE public.budget_window TO agentledger_executor;
GRANT SELECT ON TABLE public.budget_window TO agentledger_reconciler;
GRANT SELECT ON TABLE public.budget_window TO agentledger_auditor;
GRANT SELECT,INSERT,UPDATE ON TABLE public.budget_window TO agentledger_budget_counter;

--
-- Name: TABLE command_attempt; Type: ACL; Schema: public
--

GRANT SELECT,INSERT,UPDATE ON TABLE public.command_attempt TO agentledger_executor;
GRANT SELECT,INSERT,UPDATE ON TABLE public.command_attempt TO agentledger_reconciler;
GRANT SELECT ON TABLE public.command_attempt TO agentledger_auditor;
GRANT SELECT ON TABLE public.command_attempt TO agentledger_sweeper;

--
-- Name: COLUMN command_attempt.finished_at; Type: ACL; Schema: public
--

GRANT UPDATE(finished_at) ON TABLE public.command_attempt TO agentledger_sweeper;

--
-- Name: COLUMN command_attempt.result; Type: ACL; Schema: public
--

GRANT UPDATE(result) ON TABLE public.command_attempt TO agentledger_sweeper;

--
-- Name: COLUMN command_attempt.detail; Type: ACL; Schema: public
--

GRANT UPDATE(detail) ON TABLE public.command_attempt TO agentledger_sweeper;

--
-- Name: TABLE command_outbox; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.command_outbox TO agentledger_admission;
GRANT SELECT,DELETE ON TABLE public.command_outbox TO agentledger_relay;
GRANT SELECT,INSERT,DELETE ON TABLE public.command_outbox TO agentledger_executor;
GRANT SELECT,INSERT,DELETE ON TABLE public.command_outbox TO agentledger_reconciler;
GRANT SELECT ON TABLE public.command_outbox TO agentledger_sweeper;

--
-- Name: TABLE command_resolution; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.command_resolution TO agentledger_reconciler;
GRANT SELECT ON TABLE public.command_resolution TO agentledger_auditor;

--
-- Name: TABLE event_outbox; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.event_outbox TO agentledger_admission;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_executor;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_reconciler;
GRANT SELECT,DELETE ON TABLE public.event_outbox TO agentledger_relay;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_budget_keeper;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_sweeper;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_budget_counter;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_notifier;
GRANT INSERT ON TABLE public.event_outbox TO agentledger_notary;

--
-- Name: TABLE policy_decision; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.policy_decision TO agentledger_admission;
GRANT SELECT,INSERT ON TABLE public.policy_decision TO agentledger_executor;
GRANT SELECT ON TABLE public.policy_decision TO agentledger_auditor;

--
-- Name: TABLE principal; Type: ACL; Schema: public
--

GRANT SELECT ON TABLE public.principal TO agentledger_admission;
GRANT SELECT ON TABLE public.principal TO agentledger_executor;
GRANT SELECT ON TABLE public.principal TO agentledger_auditor;

--
-- Name: TABLE tenant_data_key; Type: ACL; Schema: public
--

GRANT SELECT,INSERT ON TABLE public.tenant_data_key TO agentledger_admission;
GRANT SELECT ON TABLE public.tenant_data_key TO agentledger_executor;
GRANT SELECT ON TABLE public.tenant_data_key TO agentledger_reconciler;

--
-- PostgreSQL database dump complete
--

--
-- Group roles (cluster-level; created by the migrations when absent)
--
-- agentledger_admission: NOLOGIN
-- agentledger_audit_writer: NOLOGIN
-- agentledger_auditor: NOLOGIN
-- agentledger_budget_counter: NOLOGIN
-- agentledger_budget_keeper: NOLOGIN
-- agentledger_executor: NOLOGIN
-- agentledger_ingress: NOLOGIN
-- agentledger_maintenance: NOLOGIN
-- agentledger_notary: NOLOGIN
-- agentledger_notifier: NOLOGIN
-- agentledger_planner: NOLOGIN
-- agentledger_reconciler: NOLOGIN
-- agentledger_relay: NOLOGIN REPLICATION
-- agentledger_sweeper: NOLOGIN
