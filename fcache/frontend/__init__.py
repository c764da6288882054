"""From a model to cache keys: capture, partition, canonicalize, key.

Decisions worth knowing (the modules' docstrings hold the details):

- Capture is Dynamo + AOTAutograd with Inductor's decompositions, so every executor sees
  one small aten vocabulary, forward and backward (capture.py).
- Regions are maximal runs of consecutive fusible nodes between opaque ops (matmuls,
  attention, RNG, collectives, mutation). Never reordering the graph keeps eager's peak
  memory and makes layer i's regions byte-for-byte layer j's (partition.py).
- A region's canonical text names values by position and keeps only what changes a
  kernel (ops, constants, input dtypes, shapes, strides, device type); it is both what is
  hashed and what executors compile, so nothing outside the key reaches a kernel
  (canonicalize.py).
- A key is xxh3-128 over named components, each loggable, so `fcache explain` can say
  why two regions missed each other (key.py).
"""
