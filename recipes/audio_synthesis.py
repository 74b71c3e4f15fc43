"""Audio synthesis: a DDSP decoder learns an instrument's timbre from audio alone.

    python -m recipes.audio_synthesis [--workdir DIR] [--quick] [--seed N] [--steps N] [--reverb]

Procedurally generated notes (see `recipes.ddsp`) are rendered by a datarax pipeline of
synthesiser operators (harmonic oscillators + filtered noise, `datarax.operators.audio.synth`),
which also measures each note's loudness. A small decoder maps (f0, loudness) per frame to the
synthesiser's controls (amplitude, harmonic distribution, noise filter) and is trained, through
the same synthesiser, with a multi-scale spectral loss against the rendered audio; f0 is given,
as in DDSP. With --reverb the notes are played in a room and the decoder also learns a
reverb's decay and wet gain.

Reported: the spectral loss on held-out notes before and after training, beside the loss of
the true controls (the synthesiser played with the ground-truth controls, and with --reverb the
true room's decay and wet gain, through the decoder's own noise: what a perfect decoder scores,
since its noise is a realisation independent of the target's), the Pearson correlation of the
recovered harmonic distribution with the ground truth (and the same for the untrained decoder),
and example WAV files of target and resynthesised notes. The held-out notes are rendered once,
by the first pass of a freshly built evaluation pipeline whose noise stream neither the training
notes nor the decoder draw from (`ddsp.STREAMS`), so every evaluation scores the same audio.
"""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from datarax.train.locking import run_script
from recipes import common, ddsp

NAME = "audio_synthesis"
DEFAULT = {"steps": 1500, "train_notes": 256, "eval_notes": 32, "batch_size": 16, "learning_rate": 2e-3, "hidden": 128}
QUICK = {"steps": 60, "train_notes": 48, "eval_notes": 16, "batch_size": 16, "learning_rate": 3e-3, "hidden": 64}
EXAMPLES = 3


def write_wav(path: Path, audio: np.ndarray) -> str:
    """16-bit mono WAV at the recipe's sample rate (the standard library's `wave`, no extra packages)."""
    pcm = np.clip(np.asarray(audio) / max(1.0, float(np.abs(audio).max())), -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(ddsp.SAMPLE_RATE)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    return str(path)


def examples(workdir: Path, model: ddsp.Decoder, batch: dict) -> tuple[list[str], dict]:
    """Writes target and resynthesised WAVs of the first notes; returns the paths and arrays to plot."""
    folder = workdir / "examples"
    folder.mkdir(exist_ok=True)
    audio, controls = nnx.jit(lambda m, f0, loud: m(f0, loud))(model, batch["f0_hz"], batch["loudness"])
    audio, controls = np.asarray(audio), jax.device_get(controls)
    paths = []
    for i in range(EXAMPLES):
        paths.append(write_wav(folder / f"note{i}_target.wav", np.asarray(batch["audio"][i])))
        paths.append(write_wav(folder / f"note{i}_resynthesised.wav", audio[i]))
    return paths, {"target": np.asarray(batch["audio"][0]), "resynthesised": audio[0],
                   "true": ddsp.audible_distribution(np.asarray(batch["harmonic_distribution"][0]),
                                                     np.asarray(batch["f0_hz"][0])),
                   "recovered": ddsp.audible_distribution(controls["harmonic_distribution"][0],
                                                          np.asarray(batch["f0_hz"][0]))}


def plot(workdir: Path, curve: tuple, shown: dict, losses: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    axes[0].plot(*curve, color="#1c7ed6")
    axes[0].axhline(losses["before"], color="#868e96", linestyle=":", label=f"eval, untrained {losses['before']:.2f}")
    axes[0].axhline(losses["after"], color="#2b8a3e", linestyle="--", label=f"eval, trained {losses['after']:.2f}")
    axes[0].axhline(losses["true_controls"], color="#e8590c", linestyle="-.",
                    label=f"eval, true controls {losses['true_controls']:.2f}")
    axes[0].set(xlabel="step", ylabel="multi-scale spectral loss", title="training", yscale="log")
    axes[0].legend(fontsize=7)
    vmax = float(shown["true"].max())
    for ax, key in zip(axes[1:3], ("true", "recovered")):
        ax.imshow(shown[key].T, origin="lower", aspect="auto", vmin=0, vmax=vmax, cmap="magma")
        ax.set(xlabel="frame", ylabel="harmonic", title=f"{key} harmonic distribution (note 0)")
    for key, color in (("target", "#868e96"), ("resynthesised", "#2b8a3e")):
        spectrum = np.abs(np.fft.rfft(shown[key] * np.hanning(len(shown[key]))))
        axes[3].plot(np.fft.rfftfreq(len(shown[key]), 1 / ddsp.SAMPLE_RATE), 20 * np.log10(spectrum + 1e-6),
                     color=color, label=key, linewidth=0.8)
    axes[3].set(xlabel="Hz", ylabel="dB", title="spectrum of note 0", xlim=(0, ddsp.SAMPLE_RATE / 2))
    axes[3].legend(fontsize=7)
    return common.save_figure(fig, workdir / "audio_synthesis.png")


def main(argv: list[str] | None = None) -> int:
    def extra(parser):
        parser.add_argument("--reverb", action="store_true", help="play the notes in a room; learn the reverb too")

    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["reverb"] = args.reverb
    train = ddsp.note_pipeline(ddsp.make_notes(cfg["train_notes"], args.seed), args.seed, cfg["batch_size"],
                               split="train", with_reverb=args.reverb)
    evaluation = ddsp.note_pipeline(ddsp.make_notes(cfg["eval_notes"], args.seed + 1000), args.seed,
                                    cfg["batch_size"], split="eval", with_reverb=args.reverb)
    held_out = [jax.device_get(batch) for batch in evaluation]  # its first pass; no training step sees it
    model = ddsp.Decoder(cfg["hidden"], learn_reverb=args.reverb, seed=args.seed)
    # The same seed gives the reference the decoder's noise (and room noise) realisation.
    reference = ddsp.Decoder(cfg["hidden"], learn_reverb=args.reverb, seed=args.seed, reverb_start=ddsp.TRUE_REVERB)
    losses = {"before": ddsp.held_out_loss(model, held_out),
              "true_controls": ddsp.held_out_loss(reference, held_out, true_controls=True)}
    correlation_before = ddsp.harmonic_correlation(model, held_out)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    _, run = common.train_run(workdir, model, optax.adam(schedule), train, ddsp.loss_fn, steps=cfg["steps"])
    losses["after"] = ddsp.held_out_loss(model, held_out)
    correlation = ddsp.harmonic_correlation(model, held_out)
    wavs, shown = examples(workdir, model, held_out[0])
    figure = plot(workdir, common.read_curve(workdir, "train/loss"), shown, losses)
    metrics = {"eval_loss_untrained": losses["before"], "eval_loss": losses["after"],
               "eval_loss_true_controls": losses["true_controls"],
               "eval_loss_above_true_controls": losses["after"] - losses["true_controls"],
               "loss_reduction": 1 - losses["after"] / losses["before"],
               "harmonic_correlation": correlation, "harmonic_correlation_untrained": correlation_before}
    details = {"config": cfg, "run": run.as_dict(), "wav_files": wavs, "plot": figure}
    if model.reverb is not None:
        details["reverb"] = {"learned": {"decay_s": float(model.reverb.decay()), "wet": float(model.reverb.wet())},
                             "true": ddsp.TRUE_REVERB}
    path = common.write_result(workdir, NAME, metrics, details, args)
    print(f"\nheld-out spectral loss {losses['before']:.3f} (untrained) -> {losses['after']:.3f} "
          f"({100 * metrics['loss_reduction']:.1f}% lower) after {run.step} steps; the true controls score "
          f"{losses['true_controls']:.3f} (trained {metrics['eval_loss_above_true_controls']:+.3f} from it)")
    print(f"harmonic distribution correlation with the ground truth: {correlation:.3f} "
          f"(untrained decoder: {correlation_before:.3f})")
    if "reverb" in details:
        print(f"reverb: learned decay {details['reverb']['learned']['decay_s']:.3f} s, wet "
              f"{details['reverb']['learned']['wet']:.3f} (true {ddsp.TRUE_REVERB})")
    print(common.describe_goodput(run.goodput))
    print(f"examples: {wavs[0]} ...; result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
