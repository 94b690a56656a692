"""Benchmarks: scripts that print JSON figures, not timed tests."""
