"""The text LM recipe's --quick run: packed pydoc topics, pre-training helps the held-out topics."""

from __future__ import annotations

import numpy as np
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_reports_both_arms_over_seeds_with_paired_differences(tmp_path):
    result, stdout = run_recipe("text_lm", tmp_path)
    metrics = assert_finite_metrics(result)
    seeds = result["config"]["seeds"]
    assert len(seeds) == 2
    for arm in ("fine-tuned", "scratch"):
        rates = [r["rate"] for r in result["grid"][arm]]
        assert rates == list(result["config"]["rates"])  # the same grid for both arms
        best = min(result["grid"][arm], key=lambda r: r["valid"])
        assert result["chosen_rates"][arm] == best["rate"]  # chosen on validation
        assert result["runs"][arm][str(seeds[0])] == best
        for seed in seeds:
            run = result["runs"][arm][str(seed)]
            assert run["rate"] == best["rate"] and 0 < run["best_step"] <= run["steps"]
            assert run["best_step"] % result["config"]["eval_every"] == 0 or run["best_step"] == run["steps"]
    tests = {arm: [result["runs"][arm][str(s)]["test"] for s in seeds] for arm in ("fine-tuned", "scratch")}
    assert result["table"]["fine-tuned"]["values"] == tests["fine-tuned"]
    paired = result["paired"]
    assert np.allclose(paired["values"], np.subtract(tests["fine-tuned"], tests["scratch"]))
    assert paired["half"] is not None and paired["positive"] + paired["negative"] <= len(seeds)
    assert metrics["valid_perplexity_untrained"] > metrics["test_perplexity_pre_trained_only_mean"]
    assert result["cost_steps"]["fine-tuned"] > result["cost_steps"]["scratch"]  # pre-training is charged
    assert result["python"].startswith("3.")
    assert "test perplexity" in stdout and "fine-tuned - scratch" in stdout
    assert_plot(result)


def test_validation_and_test_share_no_paragraph_or_13_word_window_with_training_text():
    from recipes.text_lm import split_topics

    parts, removed = split_topics()

    def windows(paragraphs):  # an independent count: 13-word windows as joined strings
        return {" ".join(w[i:i + 13]) for p in paragraphs for w in [p.split()] for i in range(len(w) - 12)}

    training = windows(parts["pretrain"] + parts["finetune"])
    earlier = {"valid": training, "test": training | windows(parts["valid"])}
    for split in ("valid", "test"):
        assert parts[split], split
        assert removed[split]["kept"] == len(parts[split])
        assert removed[split]["before"] == removed[split]["kept"] + removed[split]["verbatim"] + removed[split]["ngram"]
        for p in parts[split]:
            assert p not in parts["pretrain"] and p not in parts["finetune"]
            assert not windows([p]) & earlier[split], p[:80]
        if split == "test":
            assert not set(parts["test"]) & set(parts["valid"])
    assert removed["valid"]["verbatim"] + removed["valid"]["ngram"] > 0  # the docs do repeat themselves


def test_attention_stays_within_segments():
    """A token's logits do not change when another packed document in the row changes."""
    import jax.numpy as jnp
    from flax import nnx

    from recipes.text_lm import TransformerLM

    model = TransformerLM(32, 8, 16, 1, 2, seed=0)
    tokens = jnp.array([[3, 4, 5, 6, 7, 8, 9, 10]])
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 2, 0]])
    positions = jnp.array([[0, 1, 2, 0, 1, 2, 3, 0]])
    changed = tokens.at[0, :3].set(jnp.array([11, 12, 13]))
    # jitted, as training runs the model (op by op, each primitive would compile on its own)
    forward = nnx.jit(lambda model, tokens: model(tokens, segments, positions))
    a, b = forward(model, tokens), forward(model, changed)
    np.testing.assert_allclose(a[0, 3:7], b[0, 3:7], rtol=1e-6)
    assert not np.allclose(a[0, :3], b[0, :3])
