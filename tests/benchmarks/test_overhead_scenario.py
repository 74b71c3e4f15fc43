"""The `overhead` scenario: its hand-written chain does the operators' maths, and a tiny run
reports microseconds per batch consistent with its rates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.registry import BenchOptions
from benchmarks.scenarios import overhead


def test_the_floor_chain_is_the_operators_maths():
    """Each operator applied by hand to one record, with the parameters the floor draws, gives the
    floor's record (so the floor does the pipeline's work, not less)."""
    image = jnp.asarray(np.random.default_rng(0).random((32, 32, 3), dtype=np.float32))
    key = jax.random.key(7)
    k_crop, k_rest = jax.random.split(key)
    top, left = (int(v) for v in jax.random.randint(k_crop, (2,), 0, 2 * overhead.PAD + 1))
    unit = np.asarray(jax.random.uniform(k_rest, (3,)))
    padded = np.pad(np.asarray(image), ((4, 4), (4, 4), (0, 0)), mode="reflect")
    want = padded[top:top + 32, left:left + 32]
    if unit[0] < 0.5:
        want = want[:, ::-1]
    want = np.clip(want * (1 + overhead.MAX_DELTA * (2 * unit[1] - 1)), 0, 1)
    gray = (want @ np.array([0.299, 0.587, 0.114], np.float32)).mean()
    want = np.clip(gray + (1 + overhead.MAX_DELTA * (2 * unit[2] - 1)) * (want - gray), 0, 1)
    np.testing.assert_allclose(np.asarray(overhead.chain_record(image, key)), want, atol=1e-5)


def test_a_tiny_run_reports_each_row_in_microseconds_per_batch():
    rows = overhead.run(BenchOptions(repeats=1, scale=0.01))
    assert [r["scenario"] for r in rows] == ["overhead_tokens", "overhead_chain4", "overhead_synced"]
    for r in rows:
        assert r["batch_size"] == overhead.BATCH
        for side in ("datarax", "floor"):
            assert r[f"{side}_us_per_batch"] == pytest.approx(1e6 * overhead.BATCH / r[f"{side}_el_s"], rel=1e-3)
        assert r["overhead_us_per_batch"] == pytest.approx(r["datarax_us_per_batch"] - r["floor_us_per_batch"],
                                                           abs=0.02)
        assert "us/batch vs floor" in r["settings"]
    assert rows[2]["ahead0_us_per_batch"] > 0 and "dispatch_ahead=0" in rows[2]["settings"]


def test_the_dispatch_sweep_reports_every_depth_for_both_consumers():
    from benchmarks import dispatch_sweep

    results = dispatch_sweep.sweep(repeats=1, records=256)
    assert set(results) == {"synced", "unsynced"}
    for by_depth in results.values():
        assert list(by_depth) == list(dispatch_sweep.DEPTHS) and all(us > 0 for us in by_depth.values())
