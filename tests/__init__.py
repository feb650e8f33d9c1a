"""The product's tests; what they share with the benchmarks and the chaos harness is in :mod:`support`."""
