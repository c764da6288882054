"""Executors turn a canonical region into an artifact, and an artifact into a callable."""
