"""The engine: one aten graph through partition, keys, look-ups, compiles, loads and
stitching, for every model of a process.

Decisions worth knowing:

- One Session per Settings and process (session.py), owned by `fcache.process`: models
  share loaded kernels, and `close()` gives back the LMDB environment, server channel,
  threads and worker processes.
- Isomorphic regions of a graph are one job (jobs.py): looked up, compiled and loaded once.
- Misses compile in parallel worker processes (workers.py), each behind a single-flight
  lease, so a region another process is compiling is loaded when it lands. A lease is
  asked for only with a worker free (slots.py): ranks that miss together split the regions.
- The stitched graph (stitch.py) calls, in the original order, the eager ops and one
  callable per region; FX frees each value after its last use, so peak memory is eager's.
- Nothing here makes a model fail that eager would run: a region no executor takes runs
  op by op, and a failing cache tier is a counted miss.
"""
