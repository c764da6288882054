"""Benchmarks of fcache against its anchors; results under bench/results/."""
