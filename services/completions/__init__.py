"""The completions service: the outbox relay to the completions topic, and HTTP callbacks."""
