"""Process-wide event counters that the master's metrics endpoint exports.

Plain integers in one process: each master counts what it saw since it started, as
Prometheus counters do (a restart starts them at zero, which Prometheus' rate() expects).
"""

from __future__ import annotations

from collections import Counter

# Reports refused because they came from a run that had already ended ("stale"), by what
# they reported: metrics, checkpoint, progress, ... The fence's evidence that it worked.
stale_reports: Counter[str] = Counter()

# Agent messages refused because they named an allocation not placed on the sending agent
# (a confused or impersonating node), by kind: logs, exited, ...
foreign_agent_messages: Counter[str] = Counter()
