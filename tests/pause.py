"""Engines stopped while a test acts: ``paused(processes)`` stops them (SIGSTOP) for a block and
resumes them after, so a stream on them makes no token meanwhile and a test can cancel, disconnect
or fill a lane while the stream is surely still open, instead of racing the stream's end.

``Paused.reached()`` waits, inside the block, until what the test sent since the pause (a cancel, a
closed connection) has reached the stopped processes' TCP sockets (bytes waiting to be read, or a
connection the peer closed or reset): the engine then acts on it as soon as it resumes, before it can make the
rest of the stream.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import psutil

_ESTABLISHED = "01"  # /proc/net/tcp's state of a connection both ends hold open


def title(p: psutil.Process) -> str:
    """A process's command line as one string ('' if it is gone): Ray names its workers there."""
    try:
        return " ".join(p.cmdline()).strip()  # Ray pads its workers' titles with spaces
    except psutil.Error:
        return ""


def chip_processes(root: psutil.Process | None = None) -> list[psutil.Process]:
    """The chip actors (``ray::ChipWorker``) among ``root``'s descendants (default: this process's)."""
    return [p for p in (root or psutil.Process()).children(recursive=True) if title(p).startswith("ray::ChipWorker")]


def tcp_evidence(pids: list[int]) -> tuple[int, int]:
    """``(bytes waiting to be read, established connections)`` over the TCP sockets of ``pids``: a
    peer's FIN moves its connection to CLOSE_WAIT, a reset drops it from the table."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    unread = established = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                fields = row.split()
                if fields[9] in inodes:
                    unread += int(fields[4].split(":")[1], 16)
                    established += fields[3] == _ESTABLISHED
    return unread, established


class Paused:
    """Stopped processes, and what had reached their sockets when they stopped."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        assert procs, "nothing to pause"
        self.procs = procs
        self.before = (0, 0)

    def reached(self, timeout_s: float = 60) -> None:
        """Wait until something sent since the pause has reached the stopped processes' sockets."""
        deadline = time.monotonic() + timeout_s
        while True:
            unread, established = tcp_evidence([p.pid for p in self.procs])
            if unread > self.before[0] or established < self.before[1]:
                return
            assert time.monotonic() < deadline, f"nothing reached the paused processes {self.procs}"
            time.sleep(0.02)


@contextmanager
def paused(procs: list[psutil.Process]):
    """``procs`` stopped for the block (see the module docstring); yields a ``Paused``."""
    state = Paused(procs)
    for p in procs:
        p.suspend()
    try:
        state.before = tcp_evidence([p.pid for p in procs])
        yield state
    finally:
        for p in procs:
            try:
                p.resume()
            except psutil.NoSuchProcess:  # killed while stopped (a fault test's kill)
                pass
