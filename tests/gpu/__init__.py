"""GPU tests (a package: its test_matrix.py shares a basename with tests/models's)."""
