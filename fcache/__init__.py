"""fcache: compile each fused region of a PyTorch model once, per node, per cluster."""

from __future__ import annotations

from fcache.config import Settings
from fcache.errors import (
    CompileError,
    ConfigError,
    CorruptArtifact,
    FcacheError,
    StoreUnavailable,
    UnsupportedRegion,
)
from fcache.stats import ModelStats

__all__ = [
    "CompileError",
    "ConfigError",
    "CorruptArtifact",
    "FcacheError",
    "ModelStats",
    "Settings",
    "StoreUnavailable",
    "UnsupportedRegion",
]
__version__ = "0.1.0"
