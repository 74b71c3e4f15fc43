import threading
import time

import pytest

from datarax.control import Prefetcher


def test_yields_everything_in_order():
    with Prefetcher(iter(range(100)), buffer_size=3) as p:
        assert list(p) == list(range(100))


def test_producer_errors_reach_the_consumer():
    def gen():
        yield 1
        raise RuntimeError("decode failed on record 7")

    p = Prefetcher(gen(), buffer_size=2)
    assert next(p) == 1
    with pytest.raises(RuntimeError, match="decode failed on record 7"):
        next(p)
    p.close()


def test_close_while_producer_is_blocked_on_a_full_queue_does_not_deadlock():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    p = Prefetcher(endless(), buffer_size=2)
    deadline = time.time() + 5
    while len(produced) < 3 and time.time() < deadline:  # queue full, producer blocked in put
        time.sleep(0.01)
    assert p.alive
    p.close()  # the producer blocked in put() sees the stop flag between tries: closed, not timed out
    assert not p.alive
    with pytest.raises(StopIteration):
        next(p)
    p.close()  # idempotent


def test_stays_at_most_buffer_size_ahead():
    produced = []

    def gen():
        for i in range(50):
            produced.append(i)
            yield i

    p = Prefetcher(gen(), buffer_size=4)
    time.sleep(0.3)
    # buffer_size in the queue + at most one item in hand waiting to be put
    assert len(produced) <= 4 + 1
    p.close()


def test_bad_buffer_size():
    with pytest.raises(ValueError, match="buffer_size must be an int >= 1, got 0"):
        Prefetcher(iter([]), buffer_size=0)


def test_close_from_another_thread_while_consumer_waits():
    def slow():
        while True:
            time.sleep(10)
            yield 0

    p = Prefetcher(slow(), buffer_size=1)
    t = threading.Timer(0.2, p.close, kwargs={"timeout": 0.5})
    t.start()
    with pytest.raises(StopIteration):
        next(p)
    t.join()


def test_a_producer_error_is_raised_by_every_later_call_not_a_silent_end():
    def failing():
        yield 0
        raise OSError("disk gone")

    with Prefetcher(failing(), buffer_size=2) as p:
        assert next(p) == 0
        for _ in range(3):
            with pytest.raises(OSError, match="disk gone"):
                next(p)


STUCK_CHILD = r"""
import faulthandler
import signal
import sys

# Ctrl-C as an interactive Python gets it, whatever the test runner's process passed on (an ignored or
# blocked SIGINT is inherited through exec); the inherited state is printed for the failure message.
print("inherited SIGINT:", signal.getsignal(signal.SIGINT), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
      file=sys.stderr, flush=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test dumps every thread's stack if exit hangs

import numpy as np
import datarax.sources.file_folder as file_folder
from datarax import Pipeline
from datarax.host import HostMap

fifo, root, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])

def stuck(*args):
    # The test signals only once a read is blocked here. One write per line: several read threads
    # get here at once, and print's two writes ("stuck", then the newline) interleaved into
    # "stuckstuck" and empty lines, which the test read past, waiting for a line never written.
    sys.stdout.write("stuck\n")
    sys.stdout.flush()
    with open(fifo, "rb") as f:  # no writer ever comes: blocks in open(), as a read on a hung mount does
        return f.read()

file_folder._read = stuck
source = file_folder.FileFolderSource(root=root)
stage = HostMap(fn=lambda record, rng: {"data": np.int32(len(record["data"]))}, outputs={"data": ((), np.int32)},
                fields=("data",))
iterator = iter(Pipeline(source, [stage], batch_size=batch_size))
print("reading", flush=True)
next(iterator)
"""


@pytest.mark.parametrize("batch_size", [1, 4])
def test_ctrl_c_during_a_read_that_never_returns_exits(tmp_path, batch_size):
    """A real SIGINT to a process whose pipeline is stuck in a read (the reader thread for
    batch_size 1, the read pool's threads for more): it exits with KeyboardInterrupt instead of
    waiting forever for threads that cannot finish (the pool's threads were joined at exit)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    os.mkfifo(tmp_path / "fifo")
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(4):
            (tmp_path / "data" / name / f"{i}.bin").write_bytes(b"x" * (i + 1))
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(repo))
    child = subprocess.Popen([sys.executable, "-c", STUCK_CHILD, str(tmp_path / "fifo"), str(tmp_path / "data"),
                              str(batch_size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # Wait for a read to be blocked (on whichever thread reads, whenever it starts), not for a guessed time.
        lines = []
        while (line := child.stdout.readline()) and "stuck" not in line:
            lines.append(line)
        assert "stuck" in line, (lines, child.stderr.read())
        child.send_signal(signal.SIGINT)
        # The reader's exit wait is 3 s in all; the bound is only a guard against hanging forever.
        try:
            _, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGUSR1)
            time.sleep(2)  # faulthandler writes the stacks
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child did not exit within 120 s of SIGINT; its threads:\n{err[-8000:]}")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0 and "KeyboardInterrupt" in err
