"""The validation-only pilots that chose the marglik arm's settling and hyper-step rate (docs/recipes.md,
"How the settings were chosen"; the `MARGLIK` comment in `recipes.learned_augmentation`).

    python -m recipes.pilots.marglik_settle T SEED START SETTLE [KEY=VALUE ...]
    python -m recipes.pilots.marglik_settle --grid T SEED

The first trains the marglik arm once (hidden range T, seed, starting width, settling at SETTLE of
the steps; `config.NAME=VALUE` changes a `MARGLIK["config"]` setting, `cfg.NAME=VALUE` a recipe
setting, `NAME=VALUE` a `MARGLIK` one; values are JSON) and prints its final width, validation
accuracy without and with test-time averaging over the recipe's 8 copies, and the width at every
100th step. `--grid` trains the grid's seven ranges and prints the range chosen on validation
accuracy with its validation accuracy with test-time averaging. Both print one `RESULT {json}` line.
Nothing reads the test split. At the recipe's current settings the rotation's hyper-step rate is
0.1: the table's rows at 0.05 ran with `rotation_learning_rate=0.05`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from datarax import Pipeline
from recipes import common
from recipes import learned_augmentation as la
from recipes.invariance import convnet, train_marglik, train_source
from recipes.models import CLASSIFICATION_METRICS, classification_loss


def with_overrides(cfg: dict, settle: float, pairs: list[str]) -> dict:
    """The recipe's configuration with `MARGLIK["settle"]` and each `KEY=VALUE` applied."""
    cfg = {**cfg, "marglik": {**cfg["marglik"], "settle": settle, "config": dict(cfg["marglik"]["config"])}}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"settings are KEY=VALUE, got {pair!r}")
        if key.startswith("config."):
            cfg["marglik"]["config"][key.removeprefix("config.")] = json.loads(value)
        elif key.startswith("cfg."):
            cfg[key.removeprefix("cfg.")] = json.loads(value)
        else:
            cfg["marglik"][key] = json.loads(value)
    return cfg


def marglik_pilot(hidden_range: float, seed: int, start: float, settle: float, pairs: list[str]) -> dict:
    cfg = with_overrides(dict(la.DEFAULT), settle, pairs)
    data = la.rotated_splits(la.load_data(cfg), hidden_range, cfg)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        net, widths, marglik, _ = train_marglik(Path(run_dir), data, seed, cfg, start=start, affine=False, label="",
                                                callbacks=[], optimizer=la.marglik_optimizer(cfg),
                                                num_classes=la.NUM_CLASSES)
    degrees = widths["degrees"]
    history = {h["step"]: round(next(v for k, v in h.items() if k.endswith("degrees")), 1) for h in marglik.history}
    return {"T": hidden_range, "seed": seed, "start": start, "settle": settle, "extra": pairs,
            "width": round(degrees, 1), "val": la.accuracy(net, data["val"]),
            "val_tta": la.accuracy(net, data["val"], cfg["tta_copies"], degrees),
            "wall": round(time.perf_counter() - began, 1),
            "hist": {s: w for s, w in history.items() if s % 100 == 0 or s == max(history)}}


def grid_pilot(hidden_range: float, seed: int) -> dict:
    cfg = dict(la.DEFAULT)
    data = la.rotated_splits(la.load_data(cfg), hidden_range, cfg)
    rows = []
    for r in cfg["grid"]:
        pipeline = Pipeline(train_source(data, seed), [la.rotation(float(r), seed)] if r > 0 else [],
                            batch_size=cfg["batch_size"], drop_remainder=True)
        model = convnet(data, seed, cfg, la.NUM_CLASSES)
        with tempfile.TemporaryDirectory() as run_dir:
            common.train_run(Path(run_dir), model, la.optimizer(cfg, False), pipeline, classification_loss,
                             steps=cfg["steps"], metrics=CLASSIFICATION_METRICS, label="", log_every=cfg["steps"],
                             callbacks=[], checkpoint=False, goodput_plot=False)
        val = la.accuracy(model, data["val"])
        rows.append((r, val, la.accuracy(model, data["val"], cfg["tta_copies"], float(r)) if r > 0 else val))
    chosen = max(rows, key=lambda row: row[1])  # the first of equal accuracies, as the recipe's `best`
    return {"kind": "grid", "T": hidden_range, "seed": seed, "chosen": chosen[0], "val": chosen[1],
            "val_tta": chosen[2], "all": rows}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--grid"] and len(argv) == 3:
        result = grid_pilot(float(argv[1]), int(argv[2]))
    elif len(argv) >= 4 and not argv[0].startswith("-"):
        result = marglik_pilot(float(argv[0]), int(argv[1]), float(argv[2]), float(argv[3]), argv[4:])
    else:
        raise SystemExit(__doc__.split("\n\n")[1])
    print("RESULT", json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
