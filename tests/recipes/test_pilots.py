"""The pilot tool behind docs/recipes.md's marglik settings table: its KEY=VALUE overrides."""

from __future__ import annotations

import pytest

from recipes import learned_augmentation as la
from recipes.pilots.marglik_settle import with_overrides


def test_overrides_reach_the_marglik_config_the_recipe_and_the_marglik_settings_and_copy_them():
    cfg = with_overrides(dict(la.DEFAULT), 0.5, ["config.every=3", "cfg.steps=40", "rotation_learning_rate=0.05",
                                                  "config.grouped=false"])
    assert cfg["marglik"]["settle"] == 0.5
    assert cfg["marglik"]["config"]["every"] == 3 and cfg["marglik"]["config"]["grouped"] is False
    assert cfg["steps"] == 40 and cfg["marglik"]["rotation_learning_rate"] == 0.05
    # the recipe's own settings are untouched
    assert la.MARGLIK["config"]["every"] == 5 and la.DEFAULT["steps"] == 600 and la.MARGLIK["settle"] == 1 / 3
    assert la.MARGLIK["rotation_learning_rate"] == 0.1


def test_a_setting_without_a_value_is_refused_by_name():
    with pytest.raises(SystemExit, match="KEY=VALUE, got 'config.every'"):
        with_overrides(dict(la.DEFAULT), 0.5, ["config.every"])
