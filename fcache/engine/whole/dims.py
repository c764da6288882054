"""Which input dimensions of a whole stored function went dynamic, and the keys that follow
(fcache.engine.whole.route; docs/dynamic-shapes.md).

A function compiled with a dimension dynamic serves every size its guards accept, so it is
stored under the key of its input signature with that dimension's size left out
(fcache.engine.whole.key, `wildcard`). Which dimensions those are, torch's automatic
dynamic decides in a process (a dimension seen at a second size); fcache records the same
decision under the key of the signature without any size (a *marker*, in the tiers), so a
warm process at a size never seen finds the dynamic function at once. The dimensions are
named by the input's path (a0, a0.1, k:labels) and index.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fcache.cache import torch_entries
from fcache.cache.torch_entries import fcache_key
from fcache.engine.whole import key as whole_key
from fcache.engine.whole.key import ALL, Wildcard, call_key

if TYPE_CHECKING:
    from fcache.engine.backend import Backend

log = logging.getLogger(__name__)

DIMS = "dims"  # meta of a marker: the input dimensions (path, dim) that went dynamic (JSON)

Dims = frozenset[tuple[str, int]]


def keys(
    target: Callable[..., Any],
    model: torch.nn.Module | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic: bool | None,
    backend: Backend,
) -> tuple[str | None, str | None, Wildcard]:
    """The keys these inputs' function may be stored under: their exact signature's (None
    with dynamic=True) and, where input dimensions went dynamic, the key with those
    dimensions' sizes left out; and those dimensions. `args` starts with the model if any.

    dynamic=None: a dimension is dynamic once this process saw it at a second size, or a
    marker says an earlier process did; dynamic=False: never; dynamic=True: every one."""
    session = backend.session
    if dynamic is True:
        return None, call_key(target, model, args, kwargs, True, session, ALL), ALL
    exact = call_key(target, model, args, kwargs, dynamic, session)
    if dynamic is False:
        return exact, None, None
    marker = call_key(target, model, args, kwargs, None, session, ALL, marker=True)
    inputs = args[1:] if model is not None else args
    shapes = {path: tuple(t.shape) for path, t in whole_key.tensors(inputs, kwargs)}
    known = backend.whole_dims.get(marker)
    dims = set(known if known is not None else _stored(backend, marker))
    seen = backend.whole_shapes.setdefault(marker, [])
    for before in seen:
        for path, shape in shapes.items():
            old = before.get(path)
            if old is not None and len(old) == len(shape):
                pairs = enumerate(zip(old, shape, strict=True))
                dims |= {(path, d) for d, (a, b) in pairs if a != b}
    if shapes not in seen:
        seen.append(shapes)
    if dims != backend.whole_dims.get(marker, frozenset()):
        backend.whole_dims[marker] = frozenset(dims)
        if dims:  # warm processes know at once which dimensions are dynamic
            entry = torch_entries.artifact(marker, b"", str(torch.__version__))
            meta = {**entry.meta, DIMS: json.dumps(sorted(dims))}
            session.cache.put(fcache_key(marker), dataclasses.replace(entry, meta=meta))
    if not dims:
        return exact, None, None
    frozen = frozenset(dims)
    return exact, call_key(target, model, args, kwargs, None, session, frozen), frozen


def _stored(backend: Backend, marker: str) -> Dims:
    """The dimensions an earlier process saw go dynamic, from the marker's record."""
    try:
        found = backend.session.cache.get(fcache_key(marker))
        if found is None:
            dims: Dims = frozenset()
        else:
            entry = found[0]
            torch_entries.value_of(marker, entry)  # CorruptArtifact unless stored for it
            dims = frozenset((str(p), int(d)) for p, d in json.loads(entry.meta.get(DIMS, "[]")))
    except Exception as exc:  # a damaged record: as if none
        log.warning("fcache: ignoring stored dynamic dimensions %s: %s", marker, exc)
        dims = frozenset()
    backend.whole_dims[marker] = dims
    return dims
