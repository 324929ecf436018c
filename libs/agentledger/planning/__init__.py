"""Retrieval and planning: evidence in, at most one proposed action out (R1.1, R1.5, R9.4).

``retrieval`` reads the target with a READ-only token and snapshots it as untrusted evidence;
``adapters`` turn a goal and that evidence into an action + arguments (rules, an
OpenAI-compatible model, or a recorded script); ``proposer`` builds the proposal, taking
tenant, principal and operation id from the verified identity envelope only.
"""
