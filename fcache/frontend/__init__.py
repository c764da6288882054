"""From a model to cache keys: capture, partition, canonicalize, key."""
