-- The database's canonical JSON orders object members as RFC 8785 does: by the UTF-16 code
-- units of their names, not by code point.
--
-- 0050 and 0051 sorted member names `COLLATE "C"`, which in a UTF8 database is code point
-- order. RFC 8785 §3.2.3 sorts by UTF-16 code units, as the verifiers' canonicalizer (Python's
-- `rfc8785`) does. The two orders differ only where one name has a character in U+E000-U+FFFF
-- and another, at the same position, a character above U+FFFF (a surrogate pair in UTF-16, so
-- *below* U+E000 there): `{"\uffff":1,"😀":2}` is `{"😀":2,"￿":1}` in RFC 8785 and was
-- `{"￿":1,"😀":2}` here. An audit event whose payload had two such names got a leaf hash no
-- verifier reproduces: a false tamper alarm on an untouched log.
--
-- Code point order equals UTF-16 order whenever no name of the object has a character above
-- U+FFFF, so the one pass keeps `COLLATE "C"` and also notes whether any name does (a name of
-- ASCII or other one- to three-byte characters is told by its byte length alone, no regex);
-- only such an object is sorted again by agentledger_utf16_key. Same bytes as before for
-- every other object: the hashes already in the log are unchanged.

-- A name's UTF-16 code units, big-endian: bytea compares bytewise, so this orders names as
-- RFC 8785 does.
CREATE FUNCTION agentledger_utf16_key(k text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT coalesce(decode(string_agg(
           CASE WHEN cp < 65536 THEN lpad(to_hex(cp), 4, '0')
                ELSE to_hex(55296 + ((cp - 65536) >> 10)) || to_hex(56320 + ((cp - 65536) & 1023))
           END, '' ORDER BY i), 'hex'), '\x'::bytea)
    FROM (SELECT ascii(substr(k, i, 1)) AS cp, i FROM generate_series(1, length(k)) AS i) AS c
$$;

-- Whether a name has a character above U+FFFF (four bytes in UTF-8). Not STRICT, so the
-- planner inlines it (a STRICT one, with this non-strict AND, is called: ~2 us more per event).
CREATE FUNCTION agentledger_jcs_wide(k text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT octet_length(k) > length(k) AND k ~ '[\U00010000-\U0010FFFF]'
$$;

CREATE OR REPLACE FUNCTION agentledger_jcs(v jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
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
END $$;

-- 0051's payload expression, with the same rule: an object with a name above U+FFFF goes to
-- agentledger_jcs (which orders it by UTF-16), every other one is sorted in place as before.
CREATE OR REPLACE FUNCTION agentledger_jcs_payload(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN v IS NULL THEN 'null'
              WHEN jsonb_typeof(v) <> 'object' THEN public.agentledger_jcs(v)
              ELSE (SELECT CASE WHEN bool_or(public.agentledger_jcs_wide(key))
                                THEN public.agentledger_jcs(v)
                                ELSE '{' || coalesce(string_agg(
                       to_json(key)::text || ':' ||
                       CASE WHEN jsonb_typeof(value) IN ('object', 'array')
                              OR (jsonb_typeof(value) = 'number'
                                  AND value::text !~ '^-?[0-9]{1,15}$')
                            THEN public.agentledger_jcs(value) ELSE value::text END,
                       ',' ORDER BY key COLLATE "C"), '') || '}' END
                    FROM jsonb_each(v)) END
$$;
