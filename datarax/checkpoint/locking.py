"""One run per checkpoint directory: an exclusive `flock` on `<directory>/.lock`, and Orbax
temporary directories named per process so that two runs never write into one."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from etils import epath

from datarax.core.errors import DataraxError

LOCK_NAME = ".lock"


class CheckpointLockedError(DataraxError, RuntimeError):
    """Another `Checkpointer` (another run, or another object in this process) holds the directory."""


class ProcessTemporaryPath(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """Orbax's atomic-rename temporary directory, named per process: `<step>.orbax-checkpoint-tmp-<pid>`.

    Orbax's default name is the same for every process, so two runs saving the same step at once
    would write into one directory. Used only in single-process runs (the processes of a multi-host
    run must agree on one name).
    """

    @classmethod
    def from_final(cls, final_path: epath.Path, **kwargs) -> ProcessTemporaryPath:
        # ".orbax-checkpoint-tmp" from Orbax 0.12, ".orbax-checkpoint-tmp-" before: one dash either way,
        # as Orbax's own pattern for a temporary step directory (`<step>.orbax-checkpoint-tmp-<digits>`) reads it
        suffix = ocp.path.atomicity.TMP_DIR_SUFFIX.rstrip("-")
        return cls(final_path.parent / f"{final_path.name}{suffix}-{os.getpid()}", final_path, **kwargs)


def _unlock(fd: int, path: str) -> None:
    try:
        os.ftruncate(fd, 0)  # the holder's pid is no longer true; the next holder writes its own
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class DirectoryLock:
    """An exclusive `flock` on `<directory>/.lock` holding `{"pid", "host", "since"}` of its holder.

    flock belongs to the open file: a process that dies (even by SIGKILL) releases it, so a stale file
    only records who held it last and never blocks. Also released when the owning object is
    garbage-collected without `release()`.
    """

    def __init__(self, directory: epath.Path, owner: object):
        name = LOCK_NAME if jax.process_count() == 1 else f"{LOCK_NAME}.process_{jax.process_index()}"
        self.path = os.path.join(str(directory), name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointLockedError(self._held_message(directory)) from None
        except BaseException:
            os.close(fd)
            raise
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._release = weakref.finalize(owner, _unlock, fd, self.path)

    def _held_message(self, directory: epath.Path) -> str:
        try:
            with open(self.path) as f:
                holder = json.loads(f.read() or "{}")
        except (OSError, ValueError):
            holder = {}
        pid, host = holder.get("pid"), holder.get("host", "unknown host")
        if pid is None:
            who = "another process (its pid is still being written)"
        elif pid == os.getpid() and host == socket.gethostname():
            who = f"process {pid} (this process)"
        else:
            who = f"process {pid} on host {host}"
        hint = ("another Checkpointer or CheckpointCallback on this directory is still open: close() it first"
                if "this process" in who else
                "two runs must not share a checkpoint directory: wait for that run to end, stop it, or use "
                "another directory (a lock left by a process that died is released automatically)")
        return f"checkpoint directory {directory} is in use by {who} since {holder.get('since', '?')} " \
               f"(lock {self.path}); {hint}"

    def release(self) -> None:
        self._release()


def run_script(main: Callable[[], int | None]) -> int:
    """Runs a script's `main()`; a held checkpoint directory is one line on stderr and exit
    status 1, not a traceback (the message already names the holder and the fix).

    Example (the end of a training script):

        if __name__ == "__main__":
            sys.exit(run_script(main))
    """
    try:
        return main() or 0
    except CheckpointLockedError as exc:
        print(f"{os.path.basename(sys.argv[0]) or 'datarax'}: {exc}", file=sys.stderr, flush=True)
        return 1
