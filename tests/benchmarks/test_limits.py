"""The limit rows' hand-written programs compute the floor's output; the scenarios report them."""

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import limits
from benchmarks.registry import BenchOptions
from benchmarks.scenarios import augment_chain, cifar


@pytest.mark.parametrize("side, pad", [(8, 2), (12, 4), (5, 1)])
def test_selection_crop_flip_is_numpy_pad_crop_flip(side, pad):
    rng = np.random.default_rng(side)
    images = rng.random((6, side, side, 3), dtype=np.float32)
    dy, dx = rng.integers(0, 2 * pad + 1, 6), rng.integers(0, 2 * pad + 1, 6)
    flip = rng.random(6) < 0.5
    got = np.asarray(limits.selection_crop_flip(jnp.asarray(images), jnp.asarray(dy), jnp.asarray(dx),
                                                jnp.asarray(flip), pad))
    for i in range(6):
        want = np.pad(images[i], ((pad, pad), (pad, pad), (0, 0)), mode="reflect")[dy[i]:dy[i] + side,
                                                                                   dx[i]:dx[i] + side]
        np.testing.assert_array_equal(got[i], want[:, ::-1] if flip[i] else want)


@pytest.mark.parametrize("module", [cifar, augment_chain])
def test_every_limit_candidate_computes_the_floors_output(module):
    if module is cifar:
        data, batch = cifar.make_data(300), cifar.BATCH
        check, candidates = cifar.check_against_floor(data), cifar.limit_candidates(data)
    else:
        data, batch = augment_chain.make_data(40, 16), 16
        check, candidates = augment_chain.check_against_floor(data, batch), augment_chain.limit_candidates(data)
    assert len(candidates) == 2
    for per_batch, arrays in candidates.values():
        check(per_batch, arrays)  # raises when the output differs


def test_cifar_reports_the_builtin_and_limit_rows():
    rows = cifar.run(BenchOptions(repeats=1, scale=0.01))
    by = {(r["scenario"], r.get("framework", "pair")): r for r in rows}
    builtin, limit = by[("cifar_builtin", "pair")], by[("cifar_builtin", "limit")]
    assert builtin["datarax_el_s"] > 0 and limit["el_s"] > 0
    assert "the limit row" in builtin["settings"] and "fastest" in limit["settings"]
    assert ("cifar", "pair") in by
