"""Built-in example models, used by `fcache demo`, the tests and the benchmarks."""
