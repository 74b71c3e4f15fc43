"""The `rrc224` scenario: its floor draws the operator's boxes, its reference is PIL's resize, and a
small run reports every row with its error against float64; the chip probe (benchmarks/tpu/rrc_probe.py)
runs every variant in its small mode."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from benchmarks.registry import BenchOptions
from benchmarks.scenarios import rrc224
from benchmarks.tpu import layout_probe, rrc_probe


def test_the_floor_draws_the_operators_boxes():
    keys = jax.random.split(jax.random.key(3), 16)
    op = rrc224.make_op("crop")
    want = jax.vmap(lambda key: op.draw(key, (rrc224.SIDE, rrc224.SIDE, 3))["box"])(keys)
    np.testing.assert_allclose(np.asarray(rrc224.draw_boxes(keys)), np.asarray(want), rtol=1e-6)


def test_the_float64_reference_is_pils_box_resize():
    rng = np.random.default_rng(0)
    image = rng.random((40, 30, 1)).astype(np.float32)
    box = (3.25, 5.5, 20.75, 17.0)  # top, left, height, width
    got = rrc224.reference(image[None], np.asarray([box]), size=12)[0, ..., 0]
    pil_box = (box[1], box[0], box[1] + box[3], box[0] + box[2])
    want = np.asarray(Image.fromarray(image[..., 0], mode="F").resize((12, 12), Image.BILINEAR, box=pil_box))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_every_limit_candidate_writes_the_scenarios_output():
    data = rrc224.make_data(4)
    for dtype in ("float32", "bfloat16"):
        check = rrc224.check_window(4, dtype)
        for per_batch, arrays in rrc224.limit_candidates(data, dtype).values():
            check(per_batch, arrays)


@pytest.mark.parametrize("operation, dtype", [("crop", "float32"), ("resize", "float32")])
def test_both_floor_candidates_compute_the_same_crops(operation, dtype):
    images = jnp.asarray(rrc224.make_data(3)["image"])
    keys = jax.random.split(jax.random.key(1), 3)
    outs = [np.asarray(jax.jit(fn)(images, keys, 0)) for fn in rrc224.floor_candidates(operation, dtype).values()]
    np.testing.assert_allclose(outs[0], outs[1], atol=2e-6)


def test_a_small_run_reports_each_pair_and_limit_with_its_error():
    rows = rrc224.run(BenchOptions(repeats=1, scale=0.002))
    by = {(r["scenario"], r.get("framework", "pair")): r for r in rows}
    assert set(by) == {("rrc224", "pair"), ("rrc224", "limit"), ("rrc224_bf16", "pair"), ("rrc224_bf16", "limit"),
                       ("resize224", "pair")}
    for scenario in ("rrc224", "resize224"):
        pair = by[(scenario, "pair")]
        assert pair["datarax_el_s"] > 0 and pair["floor_el_s"] > 0
        assert pair["max_err"] < 2e-4 and pair["floor_max_err"] < 2e-4  # float32: within two passes' bound
        assert "the rrc224 limit row" in pair["settings"]
    assert by[("rrc224_bf16", "pair")]["max_err"] < 2 * 2 * 2.0**-8
    assert "fastest" in by[("rrc224", "limit")]["settings"]


@pytest.mark.parametrize("only, count", [("HIGH (float32)", 12), ("limit", 2)])
def test_the_chip_probe_runs_its_variants_small(capsys, only, count):
    """Each formulation at the policy's float32 precision, on records stored as the pipeline stores
    them and flattened (`--lane-dense`), and the limit rows: the probe ran on the chip at 6d1f759,
    c7aec5d and aea86f5 (benchmarks/results/tpu-v5e.jsonl); all of its variants small here took
    24 s of the suite, so the test runs these."""
    assert rrc_probe.main(["--small", "--lane-dense", "--only", only]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    variants = [line for line in lines if line["probe"] == "rrc224" and line["variant"] != "setup"]
    assert len(variants) == count and lines[-1]["probe"] == "done"
    for line in variants:
        assert "error" not in line and "skipped" not in line and line["rate"] > 0, line
        if line["operation"] != "limit":
            # on a CPU every precision is float32's: within the policy's two passes
            assert line["max_err"] < (2e-4 if line["dtype"] == "float32" else 4 * 2.0**-8), line


def test_the_layout_probe_times_both_storages_of_each_shape_small(capsys):
    assert layout_probe.main(["--small"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    timed = [line for line in lines if "storage" in line]
    assert {(tuple(line["shape"]), line["storage"]) for line in timed} == {
        (shape, storage) for shape in layout_probe.SMALL_SHAPES for storage in ("record shape", "lane-dense")}
    assert all(line["rate"] > 0 for line in timed) and lines[-1]["probe"] == "done"
