"""Run untrusted generated Python in a child process with time and memory limits.

``run(source)`` writes ``source`` into a fresh temporary directory and runs it there with this
interpreter in isolated mode (``python -I``: no ``PYTHON*`` variables, no user site, the script's
directory not on the path), an empty environment, stdin closed, in a session of its own. Before the
program starts, the child sets its limits (``resource.setrlimit``): address space
(``memory_bytes``), CPU seconds, the size of any file it writes, and no core dumps; the parent
kills the whole session once ``timeout_s`` of wall time have passed. The program's prelude then
takes away what a generated function has no use for and a mistaken one could harm: creating
processes (``os.system``, ``os.fork``, ``subprocess``), signalling them (``os.kill``), deleting or
renaming files, and sockets (the programs need no network).

This is containment for model-written test programs (a loop that never ends, a list that fills
memory, a stray ``os.remove``), as OpenAI's HumanEval harness does it, not a security boundary
against a program written to escape: for that, run the eval in a container or VM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PASSED, FAILED, TIMEOUT, MEMORY = "passed", "failed", "timeout", "memory"

MEMORY_BYTES = 1 << 30
"""Default address-space limit of the child: 1 GiB (the interpreter itself takes about 30 MB)."""
TIMEOUT_S = 10.0
"""Default wall-time limit; the CPU-time limit is the same, rounded up to whole seconds."""
FILE_BYTES = 16 << 20
"""The largest file the child may write."""

PRELUDE = '''\
import builtins as _b, os as _os, shutil as _sh, socket as _so, subprocess as _sp
def _refuse(*_a, **_k):
    raise PermissionError("not allowed in the eval's sandbox")
for _n in ("system", "kill", "killpg", "fork", "forkpty", "execv", "execve", "execvp", "execvpe",
           "spawnv", "spawnve", "spawnl", "popen", "remove", "unlink", "rmdir", "removedirs",
           "rename", "renames", "replace", "truncate", "chmod", "chown", "putenv", "setuid"):
    if hasattr(_os, _n):
        setattr(_os, _n, _refuse)
_sh.rmtree = _sh.move = _sp.Popen = _sp.run = _sp.call = _refuse
_so.socket = _so.create_connection = _refuse
del _b, _os, _sh, _so, _sp, _n
'''
"""Prepended to every program (``run``'s ``prelude=True``): what the program may not call."""


class SandboxError(ValueError):
    """Limits that cannot be applied (non-positive time or memory)."""


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``status`` is ``passed`` (exit 0), ``failed`` (an exception or a non-zero
    exit), ``timeout`` (killed at the wall or CPU limit) or ``memory`` (a ``MemoryError``, or killed
    at the address-space limit)."""

    status: str
    returncode: int | None
    seconds: float
    stderr_tail: str
    """The last 2,000 characters of the program's stderr (a traceback, usually)."""

    @property
    def passed(self) -> bool:
        return self.status == PASSED


def _limits(memory_bytes: int, cpu_s: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run(source: str, timeout_s: float = TIMEOUT_S, memory_bytes: int = MEMORY_BYTES,
        prelude: bool = True) -> Outcome:
    """Run ``source`` as a Python program under the limits (module docstring); never raises for
    anything the program does."""
    import time

    if timeout_s <= 0 or memory_bytes <= 0:
        raise SandboxError(f"limits must be positive, got timeout_s={timeout_s}, memory_bytes={memory_bytes}")
    with tempfile.TemporaryDirectory(prefix="fastmode-eval-") as cwd:
        program = Path(cwd) / "program.py"
        program.write_text((PRELUDE if prelude else "") + source)
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", str(program)], cwd=cwd, env={"PATH": "/usr/bin:/bin", "HOME": cwd},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=_limits(memory_bytes, max(1, int(-(-timeout_s // 1)))))
        try:
            _, err = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, err = proc.communicate()
        seconds = time.monotonic() - started
    tail = err.decode("utf-8", "replace")[-2000:]
    rc = proc.returncode
    if timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL):
        status = TIMEOUT
    elif rc == 0:
        status = PASSED
    elif "MemoryError" in tail:
        status = MEMORY
    else:
        status = FAILED
    return Outcome(status, None if timed_out else rc, seconds, tail)
