"""agentledger: a crash-safe runtime for AI-agent side effects on Kafka and PostgreSQL."""

__version__ = "0.1.0"
