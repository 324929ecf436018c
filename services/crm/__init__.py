"""The CRM stand-in: a real HTTP business system the executor writes to (issue 5, item 1).

Run it (own database, port and admin token from ``AGENTLEDGER_CRM_*`` settings)::

    AGENTLEDGER_CRM_DATABASE_URL=postgresql://.../crm AGENTLEDGER_CRM_ADMIN_TOKEN=s3cret \\
        python -m agentledger.services.crm            # serve (same as: ... crm serve)

Seed it, either from the CLI (talks to the database directly, prints JSON with the token)::

    python -m agentledger.services.crm seed --tenant acme --customer c-1 --name "Ada" \\
        --scopes read,write,lookup

or over HTTP with ``Authorization: Bearer <admin token>``:

- ``PUT  /admin/tenants/{tenant}/customers/{customer_id}`` body: contact fields → customer
- ``POST /admin/tenants/{tenant}/tokens`` body ``{"scopes": ["read", "write"]}`` → token (once)
- ``GET  /admin/effects?tenant=T`` → the effect log of a tenant
- ``POST|GET|DELETE /admin/faults`` (only with ``AGENTLEDGER_CRM_FAULTS_ENABLED=true``)

The business API (``Authorization: Bearer <tenant token>``) is in ``handlers``.
"""
