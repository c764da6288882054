"""The tiered artifact cache: envelope, stores (memory, LMDB, server) and their composition."""
