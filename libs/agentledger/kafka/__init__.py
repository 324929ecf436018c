"""Kafka plumbing shared by the services: topics, producers, and error → broker action."""
