"""`DeviceCopies`: on an accelerator a batch's copy to the device runs on while the producer reads
the next one; a host buffer is refilled only after the copy out of it is done, and the wait counts
as copying (one call per batch in the reader's times)."""

from __future__ import annotations

import jax
import numpy as np

from datarax.control import producers
from datarax.control.producers import COPY, DeviceCopies
from datarax.monitoring.stages import StageTimes


class Copy:
    """A copy in flight: done when the test says so, as a device transfer finishes on its own."""

    def __init__(self, buffers, log):
        self.data, self.log, self.done = {k: v.copy() for k, v in buffers.items()}, log, False


def test_a_buffer_is_refilled_only_after_its_copy_is_done_and_the_wait_counts_as_copying(monkeypatch):
    log, now = [], [0.0]
    monkeypatch.setattr(producers, "to_device", lambda buffers: log.append("copy") or Copy(buffers, log))

    def block(copy):
        log.append(("wait", copy.data["x"][0]))
        now[0] += 0.5  # the copy takes another half second to finish
        copy.done = True
        return copy

    monkeypatch.setattr(producers.jax, "block_until_ready", block)
    times = StageTimes(clock=lambda: now[0])
    copies, ring = DeviceCopies(2, times), [{"x": np.zeros(3)}, {"x": np.zeros(3)}]
    copies.in_flight = True  # as on an accelerator (on the CPU the copy is waited for inside `to_device`)
    handed = []
    for n in range(5):  # batch n in buffer n % 2
        slot = n % 2
        copies.wait(slot)
        assert all(c.done for c in handed[:-1])  # every copy but the last one is done before its buffer is reused
        ring[slot]["x"][:] = n  # the read refills the buffer
        handed.append(copies.put(slot, ring[slot], records=3))
    assert [c.data["x"][0] for c in handed] == [0, 1, 2, 3, 4]  # no batch changed by a later read
    assert log == ["copy", "copy", ("wait", 0.0), "copy", ("wait", 1.0), "copy", ("wait", 2.0), "copy"]
    (part,) = times.snapshot()
    assert part["name"] == COPY and part["calls"] == 5 and part["records"] == 15
    assert part["seconds"] == 1.5  # the three waits, each counted with the copy after it


def test_the_copy_is_kept_until_waited_for_on_an_accelerator_and_nothing_is_kept_on_the_cpu():
    """The real `to_device` on this backend: on the CPU it has waited for the copy already, so
    nothing is kept; on an accelerator (the TPU test command) the batch is kept until `wait`."""
    accelerator = jax.default_backend() != "cpu"
    copies = DeviceCopies(2, StageTimes())
    batch = copies.put(0, {"x": np.arange(3.0)}, records=3)
    np.testing.assert_array_equal(np.asarray(batch["x"]), [0.0, 1.0, 2.0])
    assert copies.in_flight is accelerator
    assert copies.batches == ([batch, None] if accelerator else [None, None])
    copies.wait(0)
    assert copies.batches == [None, None]
