"""Versioned message and command models, one module per topic family.

Import the module, not the class (``from agentledger.contracts import proposals`` →
``proposals.ProposalV1``), so a call site names its topic family.
"""
