"""The exposed-idle ledger against a step-by-step reference, and the one diagnosis vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from datarax.monitoring.ledger import INPUT_BOUND_PCT, diagnose, step_ledger


def reference(dispatched, ready, waits):
    """Plain loops: for each step after the first, the gap from the previous result to this
    dispatch, and how much of that gap lies inside any next() call."""
    busy, idle, stall = [], [], []
    for i, (d, r) in enumerate(zip(dispatched, ready)):
        prev = ready[i - 1] if i else -np.inf
        busy.append(r - max(d, prev))
        gap = max(d - prev, 0.0) if i else 0.0
        idle.append(gap)
        inside = 0.0
        if gap > 0:
            for begin, end in waits:
                inside += max(0.0, min(end, d) - max(begin, prev))
        stall.append(inside)
    return np.array(busy), np.array(idle), np.array(stall)


def random_run(rng, steps):
    """A loop on an accelerator queue: next() (sometimes several calls), dispatch, host work."""
    t, free_at = 0.0, -np.inf
    dispatched, ready, waits = [], [], []
    for _ in range(steps):
        for _ in range(rng.integers(1, 3)):
            wait = rng.exponential(0.01) if rng.random() < 0.7 else 0.0
            waits.append((t, t + wait))
            t += wait + rng.exponential(0.001)
        dispatched.append(t)
        free_at = max(t, free_at) + rng.exponential(0.01)
        ready.append(free_at)
        t += rng.exponential(0.005) if rng.random() < 0.5 else 0.0
    return np.array(dispatched), np.array(ready), waits


@pytest.mark.parametrize("seed", range(20))
def test_the_ledger_equals_the_step_by_step_reference(seed):
    rng = np.random.default_rng(seed)
    dispatched, ready, waits = random_run(rng, int(rng.integers(1, 40)))
    starts = np.array([b for b, _ in waits])
    ledger = step_ledger(dispatched, ready, starts, np.array([e - b for b, e in waits]))
    busy, idle, stall = reference(dispatched, ready, waits)
    np.testing.assert_allclose(ledger["busy_s"], busy, atol=1e-12)
    np.testing.assert_allclose(ledger["idle_s"], idle, atol=1e-12)
    np.testing.assert_allclose(ledger["stall_s"], stall, atol=1e-12)
    assert np.all(ledger["stall_s"] <= ledger["idle_s"] + 1e-12)
    # busy + idle tile the time from the first result to the last.
    assert ledger["busy_s"][1:].sum() + ledger["idle_s"].sum() == pytest.approx(ready[-1] - ready[0])


def test_an_empty_run_and_mismatched_lengths():
    empty = step_ledger(np.array([]), np.array([]), np.array([]), np.array([]))
    assert all(v.size == 0 for v in empty.values())
    with pytest.raises(ValueError, match="one entry per step, got 2 and 1"):
        step_ledger(np.array([0.0, 1.0]), np.array([0.5]), np.array([]), np.array([]))


@pytest.mark.parametrize("stall, idle, verdict", [
    (INPUT_BOUND_PCT, INPUT_BOUND_PCT, "input-bound"),
    (INPUT_BOUND_PCT, 2 * INPUT_BOUND_PCT + 1, "host-bound"),  # more idle outside next() than in it
    (INPUT_BOUND_PCT - 0.1, INPUT_BOUND_PCT - 0.1, "compute-bound"),
    (0.0, INPUT_BOUND_PCT, "host-bound"),
    (0.0, INPUT_BOUND_PCT - 0.1, "compute-bound"),
])
def test_the_verdict_follows_the_larger_idle_share(stall, idle, verdict):
    assert diagnose(stall_pct=stall, idle_pct=idle, step_s=0.01, span="of 1 s").startswith(verdict + ":")
