"""``agentledger demo``: the whole pipeline as real processes, and seven narrated scenarios.

- ``stack``: the shared Kafka/PostgreSQL check, a fresh demo database and topic namespace,
  service processes with pid files, logs and readiness polling (``agentledger down`` stops
  them through the pid files);
- ``seed``: CRM tenants, customers and tokens over the CRM's admin API, principals in the
  policy directory, development keys under ``.local/demo/keys``;
- ``fake_model``: a small OpenAI-compatible endpoint that obeys instructions planted in the
  evidence, so the prompt-injection scenario has a gullible model to fool;
- ``scenarios``: the stories, told through the public interfaces (ingress, the console's
  JSON API, the reconcile and explain commands);
- ``stories_adoption``: the last two, your own connector (``email.send`` from the outside
  distribution agentledger-email, sent to Mailpit) and an MCP client of ``agentledger mcp``;
- ``smtp_fault``: the e-mail executor's SMTP path to Mailpit, able to lose one answer after
  the message was accepted;
- ``run``: the command itself.
"""
