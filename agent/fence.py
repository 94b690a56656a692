"""The agent's fence: a separate process that kills the agent's ranks when its lease runs out.

The master declares a silent agent lost after `lost_after_s` and may then place its trials
elsewhere. Before that can happen, the ranks here must be gone, even if the agent itself is
hung (SIGSTOP, a stuck event loop) or cut off from the master. So the agent does not fence
its ranks itself: it renews a lease in this process, which it starts in a session of its
own (a signal to the agent's process group does not reach it) and which does nothing but
watch the clock. Everything here is the standard library and a poll every 50 ms.

The agent writes lines to this process's stdin:

    lease <deadline>            CLOCK_MONOTONIC seconds until which ranks may run
    kill_after <seconds>        SIGTERM to SIGKILL delay once the lease has run out
    guard <pgid> <start ticks>  a rank's process group (the rank leads it), with the rank's
                                start time from /proc, so a reused pid is never killed
    release <pgid>              the rank has exited

At the deadline every guarded group gets SIGTERM, and SIGKILL `kill_after` later; a
renewed lease does not save a group already signalled (it may be half dead). When the agent
dies, stdin closes: whatever is still guarded is killed the same way, and the fence exits.
CLOCK_MONOTONIC is one clock for every process of a host, which is what makes the
deadline the agent computes good here.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.05


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[19])


class Fence:
    def __init__(self) -> None:
        self.deadline = float("-inf")
        self.kill_after = 2.0
        self.guarded: dict[int, int] = {}  # pgid -> the leader's start ticks
        self.terminated: dict[int, float] = {}  # pgid -> when it got SIGTERM

    def handle(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "lease":
            self.deadline = float(words[1])
        elif words[0] == "kill_after":
            self.kill_after = float(words[1])
        elif words[0] == "guard":
            self.guarded[int(words[1])] = int(words[2])
        elif words[0] == "release":
            self.guarded.pop(int(words[1]), None)
            self.terminated.pop(int(words[1]), None)

    def enforce(self, now: float, agent_gone: bool = False) -> None:
        if now >= self.deadline or agent_gone:
            for pgid in list(self.guarded):
                if pgid not in self.terminated:
                    self._signal(pgid, signal.SIGTERM, now)
                    self.terminated[pgid] = now
        for pgid, since in list(self.terminated.items()):
            if now - since >= self.kill_after:
                self._signal(pgid, signal.SIGKILL, now)
                self.guarded.pop(pgid, None)
                del self.terminated[pgid]

    def _signal(self, pgid: int, sig: signal.Signals, now: float) -> None:
        if start_ticks(pgid) != self.guarded.get(pgid):
            # The rank has exited (its release is on the way) or its pid is another's now.
            self.guarded.pop(pgid, None)
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            self.guarded.pop(pgid, None)
            return
        late = now - self.deadline
        print(
            f"fence: {sig.name} to process group {pgid}, {late:.2f}s after the lease ran out",
            file=sys.stderr,
            flush=True,
        )


class FenceProcess:
    """The agent's handle on its fence: started on first use, started again if it died
    (with the lease and the guarded groups sent again)."""

    def __init__(self) -> None:
        self.deadline = float("-inf")
        self.kill_after = 2.0
        self._guarded: dict[int, int] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._lapsed_until = float("-inf")  # the end of the latest time the lease ran out

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def lapsed_since(self, since: float) -> bool:
        """Whether the lease ran out at some moment after `since` (so the fence may have
        signalled ranks started then); an agent that was hung learns it only afterwards."""
        return self.expired() or self._lapsed_until > since

    def renew(self, deadline: float, kill_after: float) -> None:
        if deadline <= self.deadline and kill_after == self.kill_after:
            return
        now = time.monotonic()
        if now >= self.deadline and deadline > now:
            self._lapsed_until = now
        self.deadline = max(deadline, self.deadline)
        self.kill_after = kill_after
        self._send(f"kill_after {kill_after}\nlease {self.deadline}\n")

    def guard(self, pid: int) -> None:
        ticks = start_ticks(pid)
        if ticks is not None:
            self._guarded[pid] = ticks
            self._send(f"guard {pid} {ticks}\n")

    def release(self, pid: int) -> None:
        if self._guarded.pop(pid, None) is not None:
            self._send(f"release {pid}\n")

    def close(self) -> None:
        if self._process is not None and self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=5)
        self._process = None

    def _send(self, text: str) -> None:
        for _ in range(2):
            if self._process is None or self._process.poll() is not None:
                self._start()
                return  # _start sent the whole state, this line included
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(text.encode())
                self._process.stdin.flush()
                return
            except OSError:
                self._process = None

    def _start(self) -> None:
        self._process = subprocess.Popen(
            # By path, isolated and without site: the standard library is all it needs.
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a signal to the agent's process group misses it
            close_fds=True,
        )
        state = [f"kill_after {self.kill_after}", f"lease {self.deadline}"]
        state += [f"guard {pid} {ticks}" for pid, ticks in self._guarded.items()]
        assert self._process.stdin is not None
        self._process.stdin.write(("\n".join(state) + "\n").encode())
        self._process.stdin.flush()


def serve(fd: int) -> None:
    fence = Fence()
    pending = b""
    open_ = True
    while open_ or fence.guarded:
        ready, _, _ = select.select([fd] if open_ else [], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_ = False  # the agent is gone
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                fence.handle(line.decode())
        elif not open_:
            time.sleep(POLL_S)
        fence.enforce(time.monotonic(), agent_gone=not open_)


def main() -> None:
    # Not the agent's terminal signals: only the agent's exit (stdin closing) ends the fence.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.fileno())


if __name__ == "__main__":
    main()
