"""Learned preprocessing: a trainable front end in the pipeline, trained jointly with the classifier.

    python -m recipes.learned_preprocessing [--workdir DIR] [--quick] [--seed N] [--variant image|audio|both]

Image: a learnable camera correction (denoising blur, colour-correction matrix, gamma curve) in
front of a CNN on corrupted photograph patches, against a fixed normalisation (see
`recipes.preprocessing_image`). Audio: a learnable PCEN front end against a fixed log-mel when
the test sounds are played at other levels and noisier than the training sounds (see
`recipes.preprocessing_audio`). Both train the front end's `nnx.Param`s and the classifier in
one step with `Trainer(..., train_pipeline_params=True)`.
"""

from __future__ import annotations

import sys

import numpy as np

from datarax.train.locking import run_script
from recipes import common
from recipes import preprocessing_audio as audio
from recipes import preprocessing_image as image

NAME = "learned_preprocessing"
DEFAULT = {
    "image": {"steps": 600, "batch_size": 64, "learning_rate": 3e-3, "front_end_learning_rate": 0.02,
              "per_class_train": 200, "per_class_test": 150, "front_ends": ("fixed", "learned", "clean")},
    "audio": {"steps": 300, "batch_size": 32, "learning_rate": 3e-3, "front_end_learning_rate": 0.02,
              "per_class_train": 150, "per_class_test": 50,
              "front_ends": ("log-mel", "pcen (fixed)", "pcen (learned)")},
}
QUICK = {
    "image": {**DEFAULT["image"], "steps": 40, "per_class_train": 50, "per_class_test": 30,
              "front_ends": ("fixed", "learned")},
    "audio": {**DEFAULT["audio"], "steps": 40, "per_class_train": 30, "per_class_test": 15,
              "front_ends": ("log-mel", "pcen (learned)")},
}
MATCHED = "gain +0 dB, snr 30 dB"


def run_image(workdir, cfg: dict, seed: int) -> tuple[dict, list[dict], dict]:
    data = image.make_patches(cfg["per_class_train"], cfg["per_class_test"], seed)
    records = [image.run(workdir, data, front_end, cfg, seed) for front_end in cfg["front_ends"]]
    metrics = {f"image_{r['front_end']}_accuracy": r["test_accuracy"] for r in records}
    return metrics, records, image.example_rows(data, records)


def run_audio(workdir, cfg: dict, seed: int) -> tuple[dict, list[dict]]:
    data = {"train": audio.make_sounds(cfg["per_class_train"], seed),
            "test": audio.make_sounds(cfg["per_class_test"], seed + 1000)}
    records = [audio.run(workdir, data, kind, cfg, seed) for kind in cfg["front_ends"]]
    metrics = {}
    for r in records:
        slug = r["front_end"].replace(" ", "_").replace("(", "").replace(")", "").replace("-", "_")
        metrics[f"audio_{slug}_mean_accuracy"] = r["mean_accuracy"]
        metrics[f"audio_{slug}_matched_accuracy"] = r["accuracy"][MATCHED]
    return metrics, records


def plot(workdir, image_records, examples, audio_records) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    panels = int(bool(image_records)) * 2 + int(bool(audio_records))
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    axes = list(axes[0])
    if image_records:
        ax = axes.pop(0)
        names = [r["front_end"] for r in image_records]
        ax.bar(names, [r["test_accuracy"] for r in image_records], color=["#868e96", "#2b8a3e", "#1c7ed6"][:len(names)])
        ax.axhline(1 / 6, color="k", linestyle=":", label="chance")
        ax.set(ylim=(0, 1), ylabel="test accuracy", title="image: corrupted patches, 6 photographs")
        ax.legend()
        ax = axes.pop(0)
        rows = [np.concatenate(list(v), axis=1) for v in examples.values()]
        ax.imshow(np.clip(np.concatenate(rows, axis=0), 0, 1))
        ax.set(title="rows: " + " / ".join(examples), xticks=[], yticks=[])
    if audio_records:
        ax = axes.pop(0)
        for color, record in zip(["#868e96", "#1c7ed6", "#2b8a3e"], audio_records):
            for snr, style in ((30.0, "-"), (10.0, "--")):
                points = [(g, record["accuracy"][f"gain {g:+.0f} dB, snr {s:.0f} dB"]) for g, s in audio.CONDITIONS
                          if s == snr]
                ax.plot(*zip(*points), style, marker="o", color=color, label=f"{record['front_end']}, {snr:.0f} dB SNR")
        ax.axhline(1 / 6, color="k", linestyle=":")
        ax.set(xlabel="playback gain (dB; training at 0 +- 6)", ylabel="accuracy", ylim=(0, 1),
               title="audio: level and noise shift at test time")
        ax.legend(fontsize=7)
    return common.save_figure(fig, workdir / "learned_preprocessing.png")


def main(argv: list[str] | None = None) -> int:
    def extra(parser):
        parser.add_argument("--variant", choices=("image", "audio", "both"), default="both")

    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra)
    workdir = common.prepare_workdir(args)
    cfg = {k: dict(v) for k, v in (QUICK if args.quick else DEFAULT).items()}
    for part in cfg.values():
        part["steps"] = args.steps or part["steps"]
    metrics, details = {"chance_accuracy": 1 / 6}, {"config": cfg}
    image_records, examples, audio_records = [], {}, []
    if args.variant in ("image", "both"):
        image_metrics, image_records, examples = run_image(workdir, cfg["image"], args.seed)
        metrics.update(image_metrics)
        details["image"] = image_records
    if args.variant in ("audio", "both"):
        audio_metrics, audio_records = run_audio(workdir, cfg["audio"], args.seed)
        metrics.update(audio_metrics)
        details["audio"] = audio_records
    details["plot"] = plot(workdir, image_records, examples, audio_records)
    path = common.write_result(workdir, NAME, metrics, details, args)
    print()
    for r in image_records:
        print(f"image {r['front_end']:>8}: test accuracy {r['test_accuracy']:.4f}")
    if len(image_records) >= 2:
        gap = image_records[1]["test_accuracy"] - image_records[0]["test_accuracy"]
        print(f"image: the learned front end {'beats' if gap > 0 else 'does not beat'} the fixed normalisation "
              f"({gap:+.4f})")
    for r in audio_records:
        print(f"audio {r['front_end']:>15}: mean accuracy over {len(r['accuracy'])} playback conditions "
              f"{r['mean_accuracy']:.4f}, at the training condition {r['accuracy'][MATCHED]:.4f}")
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
