"""Helpers for tests, benchmarks and the demo (synthetic checkpoints); never imported by the stages."""
