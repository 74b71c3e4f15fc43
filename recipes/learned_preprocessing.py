"""Learned preprocessing: a trainable front end in the pipeline, trained jointly with the classifier.

    python -m recipes.learned_preprocessing [--workdir DIR] [--quick] [--seed N] [--variant image|audio|both]

Image: a learnable camera correction (denoising blur, colour-correction matrix, gamma curve) in
front of a CNN on corrupted photograph patches, against a fixed normalisation (see
`recipes.preprocessing_image`). Audio: a learnable PCEN front end against a fixed log-mel when
the test sounds are played at other levels and noisier than the training sounds (see
`recipes.preprocessing_audio`). Both train the front end's `nnx.Param`s and the classifier in
one step with `Trainer(..., train_pipeline_params=True)`.

Baselines: for the image, an oracle front end (the exact inverse of the known corruption); for
the audio, log-mel with per-example mean normalisation and log-mel trained with gain
augmentation over the whole test range. Every front end is trained on every seed (a seed draws
the data, the initialisation, the order and the augmentation), with the same steps and rates;
the tables give means with 95% t-intervals and the paired per-seed differences of the learned
front end against each other one, per playback condition for the audio.
"""

from __future__ import annotations

import sys

import numpy as np

from datarax.checkpoint import run_script
from recipes import common
from recipes import preprocessing_audio as audio
from recipes import preprocessing_image as image

NAME = "learned_preprocessing"
DEFAULT = {
    "image": {"steps": 600, "batch_size": 64, "learning_rate": 3e-3, "front_end_learning_rate": 0.02,
              "per_class_train": 200, "per_class_test": 150, "front_ends": ("fixed", "learned", "oracle", "clean")},
    "audio": {"steps": 300, "batch_size": 32, "learning_rate": 3e-3, "front_end_learning_rate": 0.02,
              "per_class_train": 150, "per_class_test": 50, "front_ends": audio.FRONT_ENDS},
    "seeds": 5,
}
QUICK = {
    "image": {**DEFAULT["image"], "steps": 40, "per_class_train": 50, "per_class_test": 30,
              "front_ends": ("fixed", "learned", "oracle")},
    "audio": {**DEFAULT["audio"], "steps": 40, "per_class_train": 30, "per_class_test": 15,
              "front_ends": ("log-mel", "log-mel (normalised)", "pcen (learned)")},
    "seeds": 2,
}
LEARNED = {"image": "learned", "audio": "pcen (learned)"}
MATCHED = "gain +0 dB, snr 30 dB"


def run_image(workdir, cfg: dict, seed: int) -> tuple[list[dict], dict]:
    data = image.make_patches(cfg["per_class_train"], cfg["per_class_test"], seed)
    records = [image.run(workdir, data, front_end, cfg, seed) for front_end in cfg["front_ends"]]
    return records, image.example_rows(data, records)


def run_audio(workdir, cfg: dict, seed: int) -> list[dict]:
    data = {"train": audio.make_sounds(cfg["per_class_train"], seed),
            "test": audio.make_sounds(cfg["per_class_test"], seed + 1000)}
    return [audio.run(workdir, data, kind, cfg, seed) for kind in cfg["front_ends"]]


def slug(name: str) -> str:
    return name.replace(" ", "_").replace("(", "").replace(")", "").replace("-", "_")


def summarise(per_seed: dict[str, list[float]], learned: str) -> dict:
    """Each front end's mean with its interval, and the learned one minus each other one, paired."""
    return {"table": {name: common.interval(values) for name, values in per_seed.items()},
            "paired": {f"{learned} - {name}": common.paired(per_seed[learned], values)
                       for name, values in per_seed.items() if name != learned and learned in per_seed}}


def plot(workdir, image_summary, examples, audio_summary) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    panels = int(bool(image_summary)) * 2 + int(bool(audio_summary))
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    axes = list(axes[0])
    colours = ["#868e96", "#2b8a3e", "#1c7ed6", "#e8590c", "#5f3dc4"]
    if image_summary:
        ax = axes.pop(0)
        table = image_summary["table"]
        names = list(table)
        ax.bar(names, [table[n]["mean"] for n in names], yerr=[table[n]["half"] or 0 for n in names],
               color=colours[:len(names)], capsize=4)
        ax.axhline(1 / 6, color="k", linestyle=":", label="chance")
        ax.set(ylim=(0, 1), ylabel="test accuracy (mean, 95% interval)", title="image: corrupted patches")
        ax.legend()
        ax = axes.pop(0)
        rows = [np.concatenate(list(v), axis=1) for v in examples.values()]
        ax.imshow(np.clip(np.concatenate(rows, axis=0), 0, 1))
        ax.set(title="rows: " + " / ".join(examples), xticks=[], yticks=[])
    if audio_summary:
        ax = axes.pop(0)
        for colour, (name, conditions) in zip(colours, audio_summary["conditions"].items()):
            for snr, style in ((30.0, "-"), (10.0, "--")):
                points = [(g, conditions[f"gain {g:+.0f} dB, snr {s:.0f} dB"]["mean"]) for g, s in audio.CONDITIONS
                          if s == snr]
                ax.plot(*zip(*points), style, marker="o", color=colour, label=f"{name}, {snr:.0f} dB SNR")
        ax.axhline(1 / 6, color="k", linestyle=":")
        ax.set(xlabel="playback gain (dB; training at 0 +- 6)", ylabel="accuracy (mean over seeds)", ylim=(0, 1),
               title="audio: level and noise shift at test time")
        ax.legend(fontsize=6)
    return common.save_figure(fig, workdir / "learned_preprocessing.png")


def main(argv: list[str] | None = None) -> int:
    def extra(parser):
        parser.add_argument("--variant", choices=("image", "audio", "both"), default="both")
        parser.add_argument("--seeds", type=int, default=None, help="seeds (default 5; 2 with --quick)")

    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra)
    workdir = common.prepare_workdir(args)
    base = QUICK if args.quick else DEFAULT
    cfg = {k: dict(v) for k, v in base.items() if isinstance(v, dict)}
    for part in cfg.values():
        part["steps"] = args.steps or part["steps"]
    if args.seeds is not None and args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    seeds = list(range(args.seed, args.seed + (args.seeds or base["seeds"])))
    metrics, details = {"chance_accuracy": 1 / 6}, {"config": {**cfg, "seeds": seeds}}
    image_runs, examples, audio_runs = {}, {}, {}
    for seed in seeds:
        if args.variant in ("image", "both"):
            image_runs[seed], rows = run_image(workdir, cfg["image"], seed)
            examples = examples or rows
        if args.variant in ("audio", "both"):
            audio_runs[seed] = run_audio(workdir, cfg["audio"], seed)
    image_summary, audio_summary = {}, {}
    if image_runs:
        per_seed = {name: [next(r for r in image_runs[s] if r["front_end"] == name)["test_accuracy"] for s in seeds]
                    for name in cfg["image"]["front_ends"]}
        image_summary = summarise(per_seed, LEARNED["image"])
        details["image"] = {"runs": {str(s): r for s, r in image_runs.items()}, **image_summary}
        metrics |= {f"image_{slug(n)}_accuracy": t["mean"] for n, t in image_summary["table"].items()}
    if audio_runs:
        names = cfg["audio"]["front_ends"]
        record = {n: [next(r for r in audio_runs[s] if r["front_end"] == n) for s in seeds] for n in names}
        per_seed = {n: [r["mean_accuracy"] for r in record[n]] for n in names}
        audio_summary = summarise(per_seed, LEARNED["audio"])
        conditions = [f"gain {g:+.0f} dB, snr {s:.0f} dB" for g, s in audio.CONDITIONS]
        audio_summary["conditions"] = {n: {c: common.interval([r["accuracy"][c] for r in record[n]])
                                           for c in conditions} for n in names}
        learned = LEARNED["audio"]
        audio_summary["paired_conditions"] = {
            f"{learned} - {n}": {c: common.paired([r["accuracy"][c] for r in record[learned]],
                                                  [r["accuracy"][c] for r in record[n]]) for c in conditions}
            for n in names if n != learned and learned in names}
        details["audio"] = {"runs": {str(s): r for s, r in audio_runs.items()}, **audio_summary}
        for n in names:
            metrics[f"audio_{slug(n)}_mean_accuracy"] = audio_summary["table"][n]["mean"]
            metrics[f"audio_{slug(n)}_matched_accuracy"] = audio_summary["conditions"][n][MATCHED]["mean"]
    details["plot"] = plot(workdir, image_summary, examples, audio_summary)
    path = common.write_result(workdir, NAME, metrics, details, args)
    print(f"\n{len(seeds)} seeds {seeds}; mean +- 95% t-interval over seeds")
    if image_summary:
        print("image: test accuracy")
        for name, t in image_summary["table"].items():
            per_seed = " ".join(f"{v:.4f}" for v in t["values"])
            print(f"    {name:>8}: {common.describe_interval(t, 4)}   per seed {per_seed}")
        for name, d in image_summary["paired"].items():
            print(f"    {name}: {common.describe_interval(d, 4)} ({d['positive']} seeds higher, {d['negative']} lower)")
    if audio_summary:
        print("audio: accuracy, mean over the 8 playback conditions / at the training condition")
        for name, t in audio_summary["table"].items():
            print(f"    {name:>20}: {common.describe_interval(t, 4)} / "
                  f"{common.describe_interval(audio_summary['conditions'][name][MATCHED], 4)}")
        for name, d in audio_summary["paired"].items():
            print(f"    {name}: mean over conditions {common.describe_interval(d, 4)} ({d['positive']} seeds higher, "
                  f"{d['negative']} lower); per condition:")
            for condition, c in audio_summary["paired_conditions"][name].items():
                print(f"        {condition}: {common.describe_interval(c, 4)} ({c['positive']}+ / {c['negative']}-)")
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
