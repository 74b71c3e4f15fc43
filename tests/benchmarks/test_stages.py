"""`python -m benchmarks.stages` runs on a small batch, and its chain variants agree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import stages
from benchmarks.scenarios.augment_chain import hand_written_chain


def test_stage_timings_run_and_report_every_row(capsys):
    results = stages.main(["--batch", "2", "--side", "16"])
    assert len(results) == 6 and all(ms > 0 for ms in results.values())
    assert "rotation separate" in capsys.readouterr().out


def test_the_separate_rotation_gives_the_fused_chains_images():
    images = jnp.asarray(np.random.default_rng(0).random((3, 16, 16, 3)), jnp.float32)
    keys = jax.random.split(jax.random.key(1), 3)
    fused = jax.jit(lambda x, k, e: hand_written_chain(x, k, e >= 0, separate=False))(images, keys, 0)
    separate = jax.jit(lambda x, k, e: hand_written_chain(x, k, e >= 0))(images, keys, 0)
    # Coordinates up to 16 computed along two paths may round two float32 spacings apart there,
    # moving a bilinear sample of noise in [0, 1] as far (3.8e-6).
    np.testing.assert_allclose(separate, fused, atol=2 * float(np.spacing(np.float32(16))))


def test_the_previous_noise_scheme_is_standard_normal_with_16_bit_levels():
    z = np.asarray(stages.threefry_16bit_normal(jax.random.key(0), (20000,)))
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.03 and len(np.unique(z)) <= 65536
