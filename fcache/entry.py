"""The `torch_dynamo_backends` entry point: `torch.compile(model, backend="fcache")`.

torch imports this module when `torch.compile` looks the name "fcache" up, before any
graph is captured. The FCACHE_* settings are checked here, at that import, so that a bad
value stops the program at the `torch.compile` call with one message naming the variable,
not at the model's first call from inside Dynamo. `fcache.jit` checks them at its call.
"""

from __future__ import annotations

from fcache.api import backend
from fcache.config import Settings

Settings.from_env()  # raises ConfigError naming the variable; the backend reads them again

__all__ = ["backend"]
