"""The learned-augmentation recipe's --quick run (one hidden range, 90 deg): every method (the marginal-likelihood
arms included), the table, widths, costs, plot."""

from __future__ import annotations

import math

import pytest
from recipe_helpers import assert_finite_metrics, assert_plot, run_recipe


def test_quick_run_reports_the_table_over_hidden_ranges_and_methods(tmp_path):
    result, stdout = run_recipe("learned_augmentation", tmp_path)
    metrics = assert_finite_metrics(result)
    config = result["config"]
    ranges = [f"{t:g}" for t in config["hidden_ranges"]]
    starts = [f"s{s:g}" for s in config["start_degrees"]]
    learned = ("learned", "learned_tta", "hypergrad", "hypergrad_tta", "marglik", "marglik_tta", "marglik_refit",
               "marglik_refit_tta")
    methods = (["none", "grid", "grid_tta", "grid_coarse", "oracle", "affine", "affine_wide"]
               + [f"{arm}_{s}" for s in starts for arm in learned] + ["marglik_affine", "marglik_affine_tta"])
    assert result["methods"] == methods
    assert set(result["table"]) == set(ranges)
    runs = result["runs"]
    for t in ranges:
        row = result["table"][t]
        assert set(row["test"]) == set(methods)
        for method in methods:
            stats = row["test"][method]
            assert stats["n"] == len(config["seeds"])
            assert metrics[f"T{t}_{method}_test_accuracy_mean"] == stats["mean"]
            assert stats["mean"] > 3 * metrics["chance_accuracy"], (t, method)
        assert set(row["widths_degrees"]) == {"affine", "affine_wide", "marglik_affine"} | {
            f"{arm}_{s}" for s in starts for arm in ("learned", "hypergrad", "marglik")}
        assert all(0.0 < w["mean"] < 180.0 for w in row["widths_degrees"].values())
        # The affine arms: six widths, each inside its bound; the rotation width is the one in degrees.
        for arm in ("affine", "affine_wide"):
            affine = row["affine_widths"][arm]
            assert list(affine) == ["translate_x", "translate_y", "rotation", "scale", "stretch", "shear"]
            assert all(0.0 < w["mean"] < 10.0 for w in affine.values())
            assert math.degrees(affine["rotation"]["mean"]) == pytest.approx(row["widths_degrees"][arm]["mean"])
            assert all(lams[arm] in config["affine_lambdas"] for lams in row["lams"])
        assert row["grid_ranges"][0] in config["grid"]
        # The coarse grid picks from {0, 90, 180} among the grid's own runs; the oracle is r = T.
        assert all(r in (0, 90, 180) and r in config["grid"] for r in row["coarse_ranges"])
        assert row["steps"]["grid_coarse"] == len({0, 90, 180} & set(config["grid"])) * config["steps"]
        oracle = [r for r in runs if r["method"] in ("none", "grid") and r["degrees"] == float(t)]
        assert row["test"]["oracle"]["mean"] == pytest.approx(oracle[0]["test_accuracy"])
        assert set(row["fixed_lam"]) == set(starts)
        assert all(set(v) == {f"{lam:g}" for lam in config["lambdas"]} for v in row["fixed_lam"].values())
        assert all(lams[s] in config["lambdas"] for lams in row["lams"] for s in starts)
        # Every comparison gives TTA to both arms or to neither.
        for pair in row["paired"]:
            a, b = pair.split("-")
            assert ("tta" in a) == ("tta" in b), pair
        costs = row["cost_s"]
        assert all(math.isfinite(c["mean"]) and c["mean"] > 0 for c in costs.values())
        # The grid's cost covers all its trainings, the none run (its r = 0 point) included; the
        # hypergrad arm pays for its training steps and its hyper-steps.
        assert costs["grid"]["mean"] > costs["none"]["mean"]
        assert row["steps"]["affine"] == row["steps"]["affine_wide"] == len(config["affine_lambdas"]) * config["steps"]
        assert row["steps"]["grid"] == len(config["grid"]) * config["steps"]
        for s in starts:
            assert row["steps"][f"hypergrad_{s}"] == config["steps"]
            assert row["hyper_steps"][s]["count"] == config["steps"] // config["hyper"]["every"]
            # Its cost is its training steps and its hyper-steps, each at its measured median time
            # (checked as accounting, not as timings, which a loaded machine scrambles).
            for seed in config["seeds"]:
                record = next(r for r in runs if r["method"] == "hypergrad" and r["seed"] == seed
                              and f"s{r['start']:g}" == s and f"{r['T']:g}" == t)
                assert record["hyper_steps"] > 0 and record["hyper_step_s"] > 0
                assert result["per_seed"][t][str(seed)]["cost_s"][f"hypergrad_{s}"] == pytest.approx(
                    record["steps"] * record["step_s"] + record["hyper_steps"] * record["hyper_step_s"])
            assert row["cost_ratio_to_grid"][f"hypergrad_{s}"]["mean"] > 0
        # The marginal-likelihood arms: one run each, charged their steps, hyper-steps and the hyper-step's
        # compilation; their widths and prior precision reported; the joint arm's three widths inside their ranges.
        marglik = config["marglik"]["config"]
        # The rotation arm's hyper-steps end at `settle` of the steps (then each copy trains on its own); the joint
        # arm's run to the end.
        until = round(config["steps"] * config["marglik"]["settle"])
        expected_hyper = {name: len(range(marglik["burn_in"], until + 1, marglik["every"])) for name in starts}
        expected_hyper["affine"] = len(range(marglik["burn_in"], config["steps"] + 1, marglik["every"]))
        for name in [f"marglik_{s}" for s in starts] + ["marglik_affine"]:
            assert row["steps"][name] == config["steps"]
            assert row["hyper_steps"][name]["count"] == expected_hyper[name.removeprefix("marglik_")]
            assert row["prior_precision"][name]["mean"] > 0
            assert f"{name.replace('marglik', 'marglik_tta')}-grid_tta" in row["paired"] or name == "marglik_affine"
            for seed in config["seeds"]:
                start = None if name == "marglik_affine" else float(name.split("_s")[1])
                record = next(r for r in runs if r["method"] == name.split("_s")[0] and r["seed"] == seed
                              and (start is None or r["start"] == start) and f"{r['T']:g}" == t)
                assert record["hyper_compile_s"] >= 0  # the first hyper-step's excess over the median: compilation
                assert result["per_seed"][t][str(seed)]["cost_s"][name] == pytest.approx(
                    record["steps"] * record["step_s"] + record["hyper_steps"] * record["hyper_step_s"]
                    + record["hyper_compile_s"])
        # The refit: one plain grid-style training at the marglik run's width (0.1 degree), charged both runs.
        for s in starts:
            assert f"marglik_refit_tta_{s}-grid_tta" in row["paired"]
            assert row["steps"][f"marglik_refit_{s}"] == 2 * config["steps"]
            for seed in config["seeds"]:
                start = float(s[1:])
                ml = next(r for r in runs if r["method"] == "marglik" and r["seed"] == seed and r["start"] == start
                          and f"{r['T']:g}" == t)
                refit = next(r for r in runs if r["method"] in ("none", "grid") and r["seed"] == seed
                             and r["degrees"] == round(ml["width_degrees"], 1) and f"{r['T']:g}" == t)
                outcome = result["per_seed"][t][str(seed)]
                assert outcome["test"][f"marglik_refit_{s}"] == refit["test_accuracy"]
                assert outcome["test"][f"marglik_refit_tta_{s}"] == refit["test_accuracy_tta"]
                assert outcome["cost_s"][f"marglik_refit_{s}"] == pytest.approx(
                    outcome["cost_s"][f"marglik_{s}"] + refit["steps"] * refit["step_s"])
        affine = row["marglik_widths"]["marglik_affine"]
        assert set(affine) == {"degrees", "translate", "scale"}
        assert 0 <= affine["degrees"]["mean"] < 180 and 0 <= affine["translate"]["mean"] < 1
        assert 0 <= affine["scale"]["mean"] < 0.9
        assert "marglik_affine_tta-grid_tta" in row["paired"]
    per_seed = (len(config["grid"]) + len(starts) * (len(config["lambdas"]) + 2) + 2 * len(config["affine_lambdas"])
                + 1)
    refits = sum(1 for r in runs if r["method"] == "grid" and r["degrees"] not in (*config["grid"], r["T"]))
    assert refits <= len(ranges) * len(config["seeds"]) * len(starts)  # a width on a grid point reuses that run
    assert len(runs) == len(ranges) * len(config["seeds"]) * per_seed + refits
    until = round(config["steps"] * config["marglik"]["settle"])
    for s in starts:
        for arm in ("learned", "hypergrad", "marglik"):
            history = result["histories"][f"{ranges[0]}/{arm}_{s}"]
            first = config["marglik"]["config"]["burn_in"] if arm == "marglik" else (0, 1)
            assert history[0]["step"] in (first if arm != "marglik" else (first,))
            # the marglik width's last move is its last hyper-step (at or before `settle` of the steps)
            every = config["marglik"]["config"]["every"]
            last = config["steps"] if arm != "marglik" else max(range(first, until + 1, every))
            assert history[-1]["step"] == last
    assert all("test_accuracy_tta" not in r for r in runs if r["method"].startswith("affine"))
    assert_plot(result)
    for text in ("affine_wide half-widths", "paired differences", "hypergrad_s", "target <= 0.3", "marglik at T=90",
                 "marglik_affine at T=90", "marglik_refit at T=90"):
        assert text in stdout
