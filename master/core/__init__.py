"""Pure cores of the master: no I/O, no clock, no randomness of their own.

Config parsing and merging, seed derivation and trial planning live here so they can be
tested alone and reused by the services, the CLI's `--test` mode and the benchmarks.
"""
