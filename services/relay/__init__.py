"""The relay service: a thin shell around :mod:`agentledger.relay`."""
