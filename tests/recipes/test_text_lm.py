"""The text LM recipe's --quick run: packed pydoc topics, pre-training helps the held-out topics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_pretrains_exports_and_fine_tunes(tmp_path):
    result, stdout = run_recipe("text_lm", tmp_path)
    metrics = assert_finite_metrics(result)
    untrained = metrics["valid_perplexity_untrained"]
    assert metrics["valid_perplexity_pretrained"] < min(untrained, metrics["uniform_perplexity"]) / 2
    assert metrics["valid_perplexity_finetuned_from_pretrained"] < metrics["valid_perplexity_finetuned_from_scratch"]
    assert Path(result["export"]).is_dir() and Path(result["tokenizer"]).is_file()
    assert "validation perplexity" in stdout
    assert_plot(result)


def test_attention_stays_within_segments():
    """A token's logits do not change when another packed document in the row changes."""
    import jax.numpy as jnp

    from recipes.text_lm import TransformerLM

    model = TransformerLM(32, 8, 16, 1, 2, seed=0)
    tokens = jnp.array([[3, 4, 5, 6, 7, 8, 9, 10]])
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
    positions = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
    changed = tokens.at[0, :3].set(jnp.array([11, 12, 13]))
    a, b = model(tokens, segments, positions), model(changed, segments, positions)
    np.testing.assert_allclose(a[0, 3:7], b[0, 3:7], rtol=1e-6)
    assert not np.allclose(a[0, :3], b[0, :3])
