"""Peer loaders do the scenario's work (checked against numpy), and the runner reports them honestly."""

import importlib.util
import itertools

import numpy as np
import pytest

from benchmarks.peers import runner
from benchmarks.peers.common import CIFAR_MEAN, CIFAR_PAD, CIFAR_STD, PeerOptions, cifar_augment_numpy
from benchmarks.registry import SCENARIO_MODULES, BenchOptions

N, BATCH, SIDE = 48, 16, 8


def reference_augment(image, dy, dx, flip):
    """The cifar work written directly with np.pad (the definition the peers must meet)."""
    padded = np.pad(image / 255.0, ((CIFAR_PAD, CIFAR_PAD), (CIFAR_PAD, CIFAR_PAD), (0, 0)), mode="reflect")
    crop = padded[dy:dy + image.shape[0], dx:dx + image.shape[1]]
    if flip:
        crop = crop[:, ::-1]
    return (crop - CIFAR_MEAN) / CIFAR_STD


def candidates(image):
    span = range(2 * CIFAR_PAD + 1)
    return [reference_augment(image, dy, dx, flip) for dy, dx, flip in itertools.product(span, span, (False, True))]


def test_numpy_cifar_work_equals_the_np_pad_definition():
    image = np.random.default_rng(0).integers(0, 256, (SIDE, SIDE + 2, 3), dtype=np.uint8)
    span = range(2 * CIFAR_PAD + 1)
    for dy, dx, flip in itertools.product(span, span, (False, True)):
        np.testing.assert_allclose(cifar_augment_numpy(image, dy, dx, flip), reference_augment(image, dy, dx, flip),
                                   rtol=1e-5, atol=1e-5)


def cifar_data():
    rng = np.random.default_rng(1)
    return {"image": rng.integers(0, 256, (N, SIDE, SIDE, 3), dtype=np.uint8), "label": np.arange(N, dtype=np.int32)}


def token_data():
    return {"tokens": np.arange(N * 4, dtype=np.int32).reshape(N, 4)}


PEERS = [p for p in runner.PEER_MODULES if importlib.util.find_spec(runner.peer_module(p).MODULE)]


def peers_with(workload: str) -> list[str]:
    """The installed peers that do `workload` (the numpy loader does only cifar)."""
    return [p for p in PEERS if runner.workload(p, workload) is not None]


def epoch_batches(loader):
    return list(loader.epoch())


@pytest.mark.parametrize("peer", peers_with("cifar"))
def test_peer_cifar_loader_does_the_cifar_work_once_per_record(peer):
    data = cifar_data()
    loader = runner.workload(peer, "cifar")(data, PeerOptions(batch_size=BATCH, workers=0))
    first, second = epoch_batches(loader), epoch_batches(loader)
    assert [len(b["label"]) for b in first] == [BATCH] * (N // BATCH)
    labels = np.concatenate([b["label"] for b in first])
    assert sorted(labels) == list(range(N))  # every record exactly once
    assert not np.array_equal(labels, np.concatenate([b["label"] for b in second]))  # reshuffled
    images = np.concatenate([b["image"] for b in first])
    assert images.dtype == np.float32 and images.shape == (N, SIDE, SIDE, 3)
    for image, label in zip(images[:12], labels[:12]):
        assert any(np.allclose(image, c, atol=1e-4) for c in candidates(data["image"][label]))


@pytest.mark.parametrize("peer", peers_with("tokens"))
def test_peer_tokens_loader_delivers_each_row_once(peer):
    data = token_data()
    loader = runner.workload(peer, "tokens")(data, PeerOptions(batch_size=BATCH, workers=0))
    rows = np.concatenate([b["tokens"] for b in epoch_batches(loader)])
    assert rows.shape == (N, 4)
    assert sorted(rows[:, 0] // 4) == list(range(N))
    np.testing.assert_array_equal(rows, data["tokens"][rows[:, 0] // 4])


def test_check_peers_names_the_choices():
    with pytest.raises(ValueError,
                       match=r"unknown peer\(s\) \['tf'\] in --vs; choose from grain, numpy, tfdata, torch"):
        runner.check_peers(["grain", "tf"])


def test_peer_rows_report_rates_ratios_and_why_a_peer_has_no_number(monkeypatch):
    monkeypatch.setitem(SCENARIO_MODULES, "scan", "benchmarks.scenarios.scan")
    monkeypatch.setattr(runner, "installed", lambda peer: peer != "tfdata")
    seen = []

    def fake(peer, recipe, *, repeats):
        seen.append((peer, recipe, repeats))
        return {"el_s": 500.0, "el_s_runs": [500.0], "settings": "s"}

    options = BenchOptions(repeats=2, scale=0.01, peers=("torch", "tfdata"))
    rows = runner.peer_rows("tokens", [{"scenario": "tokens", "datarax_el_s": 2000.0, "floor_el_s": 4000.0}],
                            options, run=fake)
    assert rows[0] == {"scenario": "tokens", "framework": "torch", "el_s": 500.0, "ratio_to_datarax": 0.25,
                       "ratio_to_floor": 0.125, "el_s_runs": [500.0], "settings": "s", "records": 2000,
                       "batch_size": 1024}
    assert rows[1]["el_s"] is None and "tfdata is not installed" in rows[1]["error"]
    assert seen == [("torch", runner.Recipe("tokens", "benchmarks.scenarios.tokens:make_data", 2000, 1024), 2)]
    skipped = runner.peer_rows("scan", [{"scenario": "scan", "datarax_el_s": 1.0, "floor_el_s": 1.0}],
                               options, run=fake)
    assert [r["skipped"].startswith(f"no {p} workload for scenario 'scan'") for p, r in zip(options.peers, skipped)] \
        == [True, True]


@pytest.mark.skipif("grain" not in PEERS, reason="grain is not installed")
def test_run_isolated_runs_a_peer_in_a_fresh_process():
    recipe = runner.Recipe("tokens", "benchmarks.scenarios.tokens:make_data", 256, 64)
    result = runner.run_isolated("grain", recipe, repeats=1)
    assert result["el_s"] > 0 and len(result["el_s_runs"]) == 1 and "MapDataset" in result["settings"]


def test_run_isolated_turns_a_failed_peer_process_into_an_error_row(monkeypatch):
    class Done:
        returncode, stdout, stderr = 1, "", "Traceback ...\nModuleNotFoundError: No module named 'x'\n"

    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: Done())
    broken = runner.run_isolated("grain", runner.Recipe("tokens", "x:f", 8, 4), repeats=1)
    assert broken == {"error": "grain failed on tokens (exit 1): ModuleNotFoundError: No module named 'x'"}


def test_augment_chain_numpy_matches_its_definition_without_rotation():
    from benchmarks.peers.common import augment_chain_numpy, augment_chain_settings

    max_delta, _, _ = augment_chain_settings()
    image = np.random.default_rng(2).random((16, 16, 3), dtype=np.float32)
    u = np.array([0.3, 0.8, 0.2, 0.9, 0.1, 0.5])  # crop (1, 4), flipped, brighter, less contrast, no rotation
    out = augment_chain_numpy(image, u, np.zeros_like(image))
    crop = np.pad(image, ((2, 2), (2, 2), (0, 0)), mode="reflect")[1:17, 4:20][:, ::-1]
    crop = np.clip(crop * (1 + max_delta * 0.8), 0, 1)
    gray = (crop @ np.array([0.299, 0.587, 0.114], np.float32)).mean()
    expected = np.clip(gray + (1 - max_delta * 0.8) * (crop - gray), 0, 1)
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("peer", peers_with("augment_chain"))
def test_peer_augment_chain_loader_keeps_shapes_and_range(peer):
    rng = np.random.default_rng(4)
    data = {"image": rng.random((16, 16, 16, 3), dtype=np.float32), "label": np.arange(16, dtype=np.int32)}
    loader = runner.workload(peer, "augment_chain")(data, PeerOptions(batch_size=8, workers=0))
    batches = epoch_batches(loader)
    assert sorted(np.concatenate([b["label"] for b in batches])) == list(range(16))
    images = np.concatenate([b["image"] for b in batches])
    assert images.shape == (16, 16, 16, 3) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 1.0


def test_augment_chain_has_one_recipe_per_reported_size(monkeypatch):
    from benchmarks.scenarios import augment_chain

    monkeypatch.setitem(SCENARIO_MODULES, "augment_chain", "benchmarks.scenarios.augment_chain")
    recipes = runner.recipe_for("augment_chain", BenchOptions(scale=0.5))
    assert [(r.row_name, r.num_records, r.batch_size, r.data_args) for r in recipes] == [
        (f"augment_chain_{side}", int(records * 0.5), batch, (side,)) for side, records, batch in augment_chain.SIZES]
