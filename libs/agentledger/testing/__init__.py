"""What the tests, the benchmark and the demo share: one supported home, never imported by
the library itself (like FastStream's ``TestKafkaBroker``).

- ``polling``: a synchronous poll with a deadline (never a bare sleep to wait for a condition);
- ``processes``: services as child processes or as detached processes with pid files,
  readiness probes, free ports;
- ``fake_model``: a gullible OpenAI-compatible model that obeys instructions in its input;
- ``kafka_read``: reading topics to their end and a consumer group's lag;
- ``crm``: the CRM stand-in as a subprocess, and its admin API;
- ``smtp_fault``: an SMTP relay able to lose the answer to an accepted message;
- ``ledger``: commands and events written by the product's own admission statements; outbox,
  slot and topic cleanup;
- ``pipeline``: the whole pipeline (CRM, admission, relay, executors, reconciler, console) as
  real processes on a fresh database and a per-run topic namespace.

Nothing here is imported by ``import agentledger``; each module is imported on its own.
"""
