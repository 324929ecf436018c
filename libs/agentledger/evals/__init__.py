"""Model evaluation and shadow runs (R9): candidates change, the execution contracts do not.

- ``dataset``: the fixed, versioned eval set (``evals/dataset.jsonl`` + ``manifest.json``);
- ``stubs``: what replaces the outside world in a replay: a read-only CRM reader served from
  a case, and connectors that record would-be calls instead of making them (R9.2);
- ``runner``: each case through the real retrieval → planning → validation → policy path;
- ``scoring``: the per-candidate table and ``reports/eval.json``;
- ``shadow``: a candidate planner beside the production one on live requests, whose
  proposals are marked ``shadow`` and only recorded for comparison. The ledger's shadow
  flag (migration 0009) comes with every command the executor loads, which refuses to
  dispatch a shadow command.
"""
