-- The CRM stand-in's own tables, in its own database. Applied at every start: every
-- statement is idempotent, and startup holds an advisory lock so two processes don't race.

CREATE TABLE IF NOT EXISTS crm_customer (
    tenant_id      text        NOT NULL,
    customer_id    text        NOT NULL,
    display_name   text        NOT NULL,
    email          text,
    phone          text,
    address_line1  text,
    address_line2  text,
    city           text,
    postal_code    text,
    country        text,
    -- Exposed as the strong ETag; bumped by every change to the record, never by a note.
    revision       integer     NOT NULL DEFAULT 1 CHECK (revision >= 1),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, customer_id)
);

CREATE TABLE IF NOT EXISTS crm_note (
    note_id        uuid        PRIMARY KEY,
    tenant_id      text        NOT NULL,
    customer_id    text        NOT NULL,
    body           text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant_id, customer_id) REFERENCES crm_customer (tenant_id, customer_id)
);

CREATE TABLE IF NOT EXISTS crm_refund (
    refund_id      uuid        PRIMARY KEY,
    tenant_id      text        NOT NULL,
    customer_id    text        NOT NULL,
    invoice_id     text        NOT NULL,
    amount_cents   bigint      NOT NULL CHECK (amount_cents > 0),
    currency       text        NOT NULL,
    reason         text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant_id, customer_id) REFERENCES crm_customer (tenant_id, customer_id)
);

-- Only the SHA-256 of a token is stored: a leaked table grants nothing.
CREATE TABLE IF NOT EXISTS crm_api_token (
    token_sha256   bytea       PRIMARY KEY,
    tenant_id      text        NOT NULL,
    scopes         text[]      NOT NULL,
    label          text        NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- One row per (tenant, key): the primary key is what makes concurrent requests with the
-- same key produce one effect. Written in the same transaction as the effect it records.
CREATE TABLE IF NOT EXISTS crm_idempotency (
    tenant_id        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    request_hash     bytea       NOT NULL,
    method           text        NOT NULL,
    path             text        NOT NULL,
    status_code      integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);

CREATE INDEX IF NOT EXISTS crm_idempotency_expires_at ON crm_idempotency (expires_at);

-- Every applied business mutation, appended in the mutation's own transaction.
CREATE TABLE IF NOT EXISTS crm_effect (
    effect_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        text        NOT NULL,
    kind             text        NOT NULL,
    customer_id      text        NOT NULL,
    idempotency_key  text,
    request_hash     bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS crm_effect_tenant ON crm_effect (tenant_id, effect_id);

-- Fencing (Kleppmann): per (tenant, key) the highest fencing token a write carried. A write
-- with a lower token is refused in its own transaction, before anything is applied. Never
-- purged with the idempotency keys: a stale writer may wake up after its key expired.
CREATE TABLE IF NOT EXISTS crm_fence (
    tenant_id      text        NOT NULL,
    fencing_key    text        NOT NULL,
    token          bigint      NOT NULL CHECK (token >= 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, fencing_key)
);
