"""Harnesses the tests and benchmarks share: real services and the faults done to them."""
