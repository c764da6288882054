"""fcache's version, in the one place the package, the `fcache` command and fcache-server
read it from (pyproject.toml carries the same, checked by tests/deploy/test_packaging.py)."""

__version__ = "0.1.0"
