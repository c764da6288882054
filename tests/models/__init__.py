"""The CPU model matrix (a package: its test_matrix.py shares a basename with tests/gpu's)."""
