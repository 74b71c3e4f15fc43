"""The `train_step` scenario's schedule: the step alone and datarax are timed before any host
peer's loader exists, each peer on its own with its loader stopped before the next is built, and
every share is against the step alone of the datarax rounds (a cheap step stands in for the ResNet)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.peers.common import Loader
from benchmarks.registry import BenchOptions
from benchmarks.scenarios import train_step


def test_peers_come_after_datarax_one_at_a_time_each_loader_stopped(monkeypatch):
    events, shapes = [], []

    def make_step(model, tx, guard=False):
        @jax.jit
        def step(state, batch):
            return state + 1, jnp.mean(batch["image"])

        def recorded(state, batch):
            shapes.append(batch["image"].shape[0])
            return step(state, batch)

        return recorded, jnp.zeros(())

    def fake_peer(name):
        def build(data, options):
            events.append(f"{name} built")

            def epoch():
                for start in range(0, len(data["label"]), options.batch_size):
                    ids = np.arange(start, min(start + options.batch_size, len(data["label"])))
                    yield {"image": data["image"][ids].astype(np.float32), "label": data["label"][ids]}

            return Loader(epoch, f"{name} settings", close=lambda: events.append(f"{name} stopped"))
        return build

    peers = {"a": fake_peer("a"), "b": fake_peer("b")}
    monkeypatch.setattr(train_step, "make_step", make_step)
    monkeypatch.setattr(train_step, "ResNet", lambda widths, rngs: None)
    monkeypatch.setattr(train_step, "holds_accelerator", lambda: True)
    monkeypatch.setattr(train_step, "HOST_PEERS", (("a", "peer a", None), ("b", "peer b", 2)))
    monkeypatch.setattr(train_step, "workload", lambda peer, scenario: peers[peer])
    monkeypatch.setattr(train_step, "installed", lambda peer: True)
    monkeypatch.setattr(train_step, "log", lambda text: events.append(text.split(":")[0]))
    rows = train_step.run(BenchOptions(repeats=2, scale=0.3))  # 614 records: 2 full batches an epoch

    sides = [f"{side}, {when}" for when in ("warm-up", "round 1", "round 2")
             for side in ("step alone", "step alone, guarded", "datarax")]
    peer_a = ["peer a", "step alone, warm-up", "peer a, warm-up", "step alone, round 1", "peer a, round 1",
              "step alone, round 2", "peer a, round 2", "a stopped"]
    peer_b = [e.replace("peer a", "peer b").replace("a stopped", "b stopped") for e in peer_a]
    assert [e for e in events if "records" not in e] == sides + ["a built"] + peer_a + ["b built"] + peer_b
    assert set(shapes) == {256}  # full batches only: the datarax epoch's short last batch is dropped
    by_name = {row["framework"]: row for row in rows}
    assert list(by_name) == ["step alone", "step alone, guarded", "datarax", "peer a", "peer b"]
    assert by_name["step alone, guarded"]["guard_cost_pct"] == pytest.approx(
        100 * (1 - by_name["step alone, guarded"]["el_s"] / by_name["step alone"]["el_s"]), abs=0.01)
    alone = by_name["step alone"]["el_s"]
    for name in ("datarax", "peer a", "peer b"):
        row = by_name[name]
        assert row["pipeline_share_pct"] == pytest.approx(100 * (1 - row["el_s"] / alone), abs=0.01)
        assert len(row["el_s_runs"]) == 2
    assert "step alone timed beside it" in by_name["peer b"]["settings"]
    assert by_name["peer b"]["settings"].endswith("b settings; host -> device_put")
