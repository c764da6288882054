"""The engine: one aten graph through partition, keys, look-ups, compiles, loads and
stitching, for every model of a process. The route a step takes, by folder:

    backend.py     torch.compile's backend: a Dynamo graph -> AOTAutograd -> programs
    whole/         a warm process loads the whole compiled forward and skips Dynamo
    programs/      a warm process loads a graph's program and skips AOTAutograd
    compile/       a graph's regions: look-up, compile (workers, leases), load, stitch
    rewrite/       the stitched graph: views folded, matmuls padded
    blocks.py      fcache.jit(blocks=True): repeated layers compiled in place
    cudagraphs.py  CUDA graphs around a stitched program (FCACHE_CUDA_GRAPHS=1)
    record.py      what compiling one model cost (fcache.stats)

Decisions worth knowing:

- One Session per Settings and process (compile/session.py), owned by `fcache.process`:
  models share loaded kernels, and `close()` gives back the LMDB environment, server
  channel, threads and worker processes.
- Isomorphic regions of a graph are one job (compile/jobs.py): looked up, compiled and
  loaded once.
- Misses compile in parallel worker processes (compile/workers.py), each behind a
  single-flight lease, so a region another process is compiling is loaded when it lands.
  A lease is asked for only with a worker free (compile/slots.py): ranks that miss
  together split the regions.
- The stitched graph (rewrite/stitch.py) calls, in the original order, the eager ops and
  one callable per region; FX frees each value after its last use, so peak memory is
  eager's.
- Nothing here makes a model fail that eager would run: a region no executor takes runs
  op by op, and a failing cache tier is a counted error, never an exception.
"""
