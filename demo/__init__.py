"""``agentledger demo``: the whole pipeline as real processes, and eight narrated scenarios.

A program of the repository, not of the library (like procrastinate's demo): it is not in
the wheel or the image. ``make demo`` (= ``agentledger demo``) runs it from a checkout.

- ``stack``: the shared Kafka/PostgreSQL check, a fresh demo database and topic namespace;
  the services are detached processes with pid files (``agentledger.testing.processes``;
  ``agentledger down`` stops them through the pid files);
- ``seed``: CRM tenants, customers and tokens over the CRM's admin API, principals in the
  policy directory, development keys under ``.local/demo/keys``;
- ``launch``: every service started and probed, the fake model
  (``agentledger.testing.fake_model``, obeying instructions planted in the evidence) and the
  e-mail path to Mailpit that can lose an answer (``agentledger.testing.smtp_fault``), and
  Keycloak (``agentledger.testing.keycloak``), which the MCP story waits for and seeds;
- ``scenarios``: the stories, told through the public interfaces (ingress, the console's
  JSON API, the operator's ``agentledger`` commands, the library's explain);
- ``commands``: the commands it prints for a person to type, written to work when pasted in
  a fresh shell (and the files they need: ``<home>/env``, ``<home>/tokens/``);
- ``adoption``: the operator's configuration of the adoption stories (e-mail connector,
  Mailpit, the declared HTTP API);
- ``stories_adoption``: the last three, your own connector (``email.send`` from the outside
  distribution agentledger-email, sent to Mailpit), an MCP client of ``agentledger mcp``
  (OAuth 2.1: the server's 401 names Keycloak, which gives the client its token by client
  credentials) and a REST API declared, not coded;
- ``run``: the command itself.
"""
