"""The cluster harness shared by tests/ and benchmarks/: real det-master and det-agent
processes started, waited for and stopped (cluster), and the figures every report and
assertion message uses (figures). Not part of the wheel: nothing a user installs needs it."""
