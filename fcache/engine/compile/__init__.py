"""Compile orchestration: one graph's regions looked up, compiled (in worker processes,
behind single-flight leases and compile slots), validated against eager, loaded, and the
graph stitched; the per-process `Session` that does it for every model."""
