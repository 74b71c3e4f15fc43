"""Audio synthesis: a DDSP decoder learns an instrument's timbre from audio alone.

    python -m recipes.audio_synthesis [--workdir DIR] [--quick] [--seed N] [--steps N]
        [--instrument {ddsp,karplus,fm} ...] [--seeds N] [--reverb]

A small decoder maps (f0, loudness) per frame to the controls of a harmonic + filtered-noise
synthesiser (`datarax.operators.audio.synth`) and is trained, through that synthesiser, with a
multi-scale spectral loss against the notes' audio; f0 is given, as in DDSP. Instruments
(`recipes.ddsp`): "ddsp", notes rendered by a datarax pipeline of the same synthesiser operators
(inside the decoder's model class: its controls exist and are known); "karplus", Karplus-Strong
plucked strings, and "fm", two-operator FM with inharmonic partials, both rendered in numpy and
outside the class. Every pipeline measures each note's A-weighted loudness (`LoudnessOperator`).
With --reverb ("ddsp" only) the notes are played in a room and the decoders also learn a reverb.

Arms, each on every seed (decoder initialisation, training-note draws and order, the decoders'
noise): the untrained decoder; the **constant-timbre** decoder (`ddsp.ConstantTimbreDecoder`: one
learned harmonic distribution and noise band shape for every note and frame, levels from the
same MLP), trained exactly like the decoder (same loss, steps, batches, learning rate); the
trained **decoder**; and for "ddsp" the **true controls** (the synthesiser played with the
ground-truth controls through the decoder's own noise: what a perfect decoder scores) and the
**mean timbre** (the true amplitude and noise with the training notes' mean harmonic distribution).
Metrics on the held-out notes (the same notes and target audio for every seed): the spectral
loss; DDSP's f0 L1 (cents, `librosa.pyin` on target and resynthesis, frames voiced in both) and
loudness L1 (dB, A-weighted, per frame); for "ddsp" the correlation of the played harmonic
distribution with the true one. The table gives means with 95% t-intervals over seeds and the
paired per-seed differences decoder - constant timbre (and decoder - mean timbre).
"""

from __future__ import annotations

import sys
import time
import wave
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from datarax.checkpoint import run_script
from recipes import common, ddsp

NAME = "audio_synthesis"
DEFAULT = {"steps": 1500, "train_notes": 256, "eval_notes": 32, "batch_size": 16, "learning_rate": 2e-3, "hidden": 128,
           "seeds": 3, "instruments": ["ddsp", "karplus"]}
QUICK = {"steps": 20, "train_notes": 32, "eval_notes": 4, "batch_size": 8, "learning_rate": 3e-3, "hidden": 32,
         "seeds": 2, "instruments": ["ddsp", "karplus"]}
EXAMPLES = 3
ARMS = ("untrained", "constant", "decoder", "mean_timbre", "true_controls")
ARM_NAMES = {"untrained": "untrained decoder", "constant": "constant timbre (trained)", "decoder": "decoder (trained)",
             "mean_timbre": "mean timbre, true envelope", "true_controls": "true controls (reference)"}
METRICS = ("spectral_loss", "loudness_l1_db", "f0_l1_cents", "f0_voiced_both", "harmonic_correlation")
BASELINES = ("constant", "mean_timbre")


def write_wav(path: Path, audio: np.ndarray) -> str:
    """16-bit mono WAV at the recipe's sample rate (the standard library's `wave`, no extra packages)."""
    pcm = np.clip(np.asarray(audio) / max(1.0, float(np.abs(audio).max())), -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(ddsp.SAMPLE_RATE)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    return str(path)


def score(arm_audio: np.ndarray, targets: list[np.ndarray], target_track: tuple, loudness_target: np.ndarray,
          held_out: list[dict], distributions: list | None, clock: dict) -> dict[str, float]:
    """Every metric of one arm's resynthesis of the held-out notes (NaN where it does not exist)."""
    began = time.perf_counter()
    f0 = ddsp.f0_l1_from_tracks(target_track, ddsp.pitch_track(arm_audio))
    clock["pyin_s"] += time.perf_counter() - began
    loud = np.asarray(ddsp.frame_loudness(jnp.asarray(arm_audio)))
    out = {"spectral_loss": ddsp.spectral_loss_of(targets, arm_audio),
           "loudness_l1_db": float(np.mean(np.abs(loud - loudness_target))),
           "f0_l1_cents": f0["cents"], "f0_voiced_both": f0["voiced_both"], "harmonic_correlation": float("nan")}
    if distributions is not None:
        out["harmonic_correlation"] = ddsp.correlation_with_truth(held_out, distributions)
    return out


def run_instrument(workdir: Path, instrument: str, cfg: dict, seeds: list[int], base_seed: int, reverb: bool,
                   clock: dict) -> dict:
    """Trains the decoder and the constant-timbre decoder on every seed; scores every arm on the held-out notes."""
    # The held-out notes and their target audio are the same for every seed (the base seed's).
    evaluation = ddsp.note_pipeline(ddsp.instrument_notes(instrument, cfg["eval_notes"], base_seed + 1000), base_seed,
                                    cfg["batch_size"], split="eval", with_reverb=reverb)
    held_out = [jax.device_get(batch) for batch in evaluation]  # its first pass; no training step sees it
    targets = [np.asarray(b["audio"]) for b in held_out]
    target = np.concatenate(targets)
    began = time.perf_counter()
    target_track = ddsp.pitch_track(target)
    clock["pyin_s"] += time.perf_counter() - began
    loudness_target = np.asarray(ddsp.frame_loudness(jnp.asarray(target)))
    in_class = instrument == "ddsp"
    per_seed = {arm: {m: [] for m in METRICS} for arm in ARMS
                if in_class or arm not in ("mean_timbre", "true_controls")}
    runs, shown = {}, {}
    for seed in seeds:
        train_notes = ddsp.instrument_notes(instrument, cfg["train_notes"], seed)
        decoder = ddsp.Decoder(cfg["hidden"], learn_reverb=reverb, seed=seed)
        played = {"untrained": ddsp.resynthesise(decoder, held_out)}
        for arm, model in (("constant", ddsp.ConstantTimbreDecoder(cfg["hidden"], learn_reverb=reverb, seed=seed)),
                           ("decoder", decoder)):
            train = ddsp.note_pipeline(train_notes, seed, cfg["batch_size"], split="train", with_reverb=reverb)
            schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20),
                                                          cfg["steps"])
            run_dir = workdir / instrument / f"seed{seed}" / arm
            _, run = common.train_run(run_dir, model, optax.adam(schedule), train, ddsp.loss_fn, steps=cfg["steps"],
                                      label=f"[{instrument} seed {seed} {arm}] ", goodput_plot=False)
            runs[f"seed{seed}/{arm}"] = run.as_dict() | {"curve": common.read_curve(run_dir, "train/loss")}
            if model.reverb is not None:
                runs[f"seed{seed}/{arm}"]["reverb"] = {"decay_s": float(model.reverb.decay()),
                                                       "wet": float(model.reverb.wet())}
            played[arm] = ddsp.resynthesise(model, held_out)
        if in_class:
            # The same seed gives the reference the decoder's noise (and room noise) realisation.
            reference = ddsp.Decoder(cfg["hidden"], learn_reverb=reverb, seed=seed, reverb_start=ddsp.TRUE_REVERB)
            played["true_controls"] = ddsp.resynthesise(
                reference, held_out, [{n: b[n] for n in ddsp.CONTROLS} for b in held_out])
            played["mean_timbre"] = ddsp.resynthesise(reference, held_out,
                                                      ddsp.mean_timbre_controls(train_notes, held_out))
        for arm, (audio, controls) in played.items():
            distributions = [c["harmonic_distribution"] for c in controls] if in_class else None
            for m, v in score(audio, targets, target_track, loudness_target, held_out, distributions, clock).items():
                per_seed[arm][m].append(v)
        if seed == seeds[0]:
            shown = {"target": target, "decoder": played["decoder"][0], "constant": played["constant"][0]}
    return {"per_seed": per_seed, "runs": runs, "shown": shown, "held_out": held_out,
            "pyin_frames": int(target_track[0].size)}


def summarise(per_seed: dict) -> dict:
    """Per arm and metric the mean with its t-interval; decoder minus each baseline, paired by seed."""
    def finite(values):
        return all(np.isfinite(values))

    arms = {arm: {m: common.interval(v) for m, v in metrics.items() if finite(v)} for arm, metrics in per_seed.items()}
    paired = {f"decoder - {base}": {m: common.paired(per_seed["decoder"][m], per_seed[base][m])
                                    for m in METRICS if finite(per_seed["decoder"][m]) and finite(per_seed[base][m])}
              for base in BASELINES if base in per_seed}
    return {"arms": arms, "paired": paired}


def examples(workdir: Path, instrument: str, shown: dict) -> list[str]:
    """Target and decoder (first seed) WAVs of the first held-out notes."""
    folder = workdir / "examples"
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(EXAMPLES):
        paths.append(write_wav(folder / f"{instrument}_note{i}_target.wav", shown["target"][i]))
        paths.append(write_wav(folder / f"{instrument}_note{i}_resynthesised.wav", shown["decoder"][i]))
    return paths


def plot(workdir: Path, summaries: dict, shown: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    instruments = list(summaries)
    fig, axes = plt.subplots(1, 3 + len(instruments), figsize=(5 * (3 + len(instruments)), 3.8))
    colors = {"untrained": "#868e96", "constant": "#f08c00", "decoder": "#2b8a3e", "mean_timbre": "#ae3ec9",
              "true_controls": "#1c7ed6"}
    for ax, metric, label in zip(axes, ("spectral_loss", "loudness_l1_db", "f0_l1_cents"),
                                 ("spectral loss", "loudness L1 (dB)", "f0 L1 (cents)")):
        for j, arm in enumerate(ARMS):
            xs, ys, es = [], [], []
            for i, instrument in enumerate(instruments):
                stats = summaries[instrument]["arms"].get(arm, {}).get(metric)
                if stats is not None:
                    xs.append(i + 0.16 * (j - 2))
                    ys.append(stats["mean"])
                    es.append(stats["half"] or 0.0)
            ax.bar(xs, ys, width=0.15, yerr=es, color=colors[arm], label=ARM_NAMES[arm])
        ax.set(xticks=range(len(instruments)), xticklabels=instruments, ylabel=label, yscale="log",
               title=f"{label}: mean, 95% interval")
    axes[0].legend(fontsize=7)
    for ax, instrument in zip(axes[3:], instruments):
        for key, color in (("target", "#868e96"), ("constant", "#f08c00"), ("decoder", "#2b8a3e")):
            note = shown[instrument][key][0]
            spectrum = np.abs(np.fft.rfft(note * np.hanning(len(note))))
            ax.plot(np.fft.rfftfreq(len(note), 1 / ddsp.SAMPLE_RATE), 20 * np.log10(spectrum + 1e-6), color=color,
                    label=key, linewidth=0.7)
        ax.set(xlabel="Hz", ylabel="dB", title=f"{instrument}: held-out note 0, seed 0", xlim=(0, ddsp.SAMPLE_RATE / 2))
        ax.legend(fontsize=7)
    return common.save_figure(fig, workdir / "audio_synthesis.png")


def print_table(instrument: str, summary: dict, seeds: list[int], cfg: dict) -> None:
    kind = "inside the decoder's model class" if instrument == "ddsp" else "outside the decoder's model class"
    print(f"\ninstrument {instrument} ({kind}); {len(seeds)} seeds {seeds}, {cfg['eval_notes']} held-out notes "
          f"(the same for every seed); mean +- 95% t-interval over seeds")
    columns = [("spectral_loss", "spectral loss", 3), ("loudness_l1_db", "loudness L1 dB", 2),
               ("f0_l1_cents", "f0 L1 cents", 1), ("f0_voiced_both", "voiced both", 2)]
    if instrument == "ddsp":
        columns.append(("harmonic_correlation", "harmonic corr", 4))
    print(f"{'arm':>28} | " + " | ".join(f"{title:>17}" for _, title, _ in columns))
    for arm, stats in summary["arms"].items():
        cells = [common.describe_interval(stats[m], d) if m in stats else "n/a" for m, _, d in columns]
        print(f"{ARM_NAMES[arm]:>28} | " + " | ".join(f"{c:>17}" for c in cells))
    for name, diffs in summary["paired"].items():
        cells = [f"{common.describe_interval(diffs[m], d)} ({diffs[m]['positive']}+/{diffs[m]['negative']}-)"
                 if m in diffs else "n/a" for m, _, d in columns]
        print(f"{'paired ' + name:>28} | " + " | ".join(cells))


def main(argv: list[str] | None = None) -> int:
    def extra(parser):
        parser.add_argument("--instrument", nargs="+", choices=ddsp.INSTRUMENTS, default=None,
                            help="instruments to learn (default and --quick: ddsp karplus)")
        parser.add_argument("--seeds", type=int, default=None, help="seeds per arm (default 3; --quick 2)")
        parser.add_argument("--reverb", action="store_true",
                            help="play the 'ddsp' notes in a room; the decoders learn a reverb too")

    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    cfg["instruments"] = list(args.instrument or cfg["instruments"])
    cfg["seeds"] = args.seeds or cfg["seeds"]
    cfg["reverb"] = args.reverb
    if cfg["seeds"] < 1:
        raise SystemExit(f"--seeds must be >= 1, got {cfg['seeds']}")
    if args.reverb and cfg["instruments"] != ["ddsp"]:
        raise SystemExit(f"--reverb plays the 'ddsp' instrument's notes in a room: pass --instrument ddsp with it "
                         f"(got --instrument {' '.join(cfg['instruments'])})")
    workdir = common.prepare_workdir(args)
    began = time.perf_counter()
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    clock = {"pyin_s": 0.0}
    summaries, details, shown, wavs, pyin_frames = {}, {}, {}, [], 0
    for instrument in cfg["instruments"]:
        out = run_instrument(workdir, instrument, cfg, seeds, args.seed, args.reverb, clock)
        summaries[instrument] = summarise(out["per_seed"])
        details[instrument] = {"per_seed": out["per_seed"], "runs": out["runs"]}
        shown[instrument] = out["shown"]
        wavs += examples(workdir, instrument, out["shown"])
        pyin_frames += out["pyin_frames"]
    figure = plot(workdir, summaries, shown)
    metrics = {}
    for instrument, summary in summaries.items():
        for arm, stats in summary["arms"].items():
            metrics |= {f"{instrument}.{arm}.{m}": s["mean"] for m, s in stats.items()}
        for name, diffs in summary["paired"].items():
            metrics |= {f"{instrument}.{name.replace(' ', '')}.{m}": d["mean"] for m, d in diffs.items()}
    wall = time.perf_counter() - began
    result = {"config": cfg, "seeds": seeds, "summary": summaries, "details": details, "wav_files": wavs,
              "plot": figure, "wall_s": wall, "pyin_s": clock["pyin_s"]}
    path = common.write_result(workdir, NAME, metrics, result, args)
    for instrument, summary in summaries.items():
        print_table(instrument, summary, seeds, cfg)
    arms_scored = sum(len(s["arms"]) for s in summaries.values()) * len(seeds) + len(summaries)
    print(f"\npyin: {clock['pyin_s']:.1f} s for {arms_scored} pitch tracks of {cfg['eval_notes']} notes "
          f"({pyin_frames // max(1, len(summaries))} frames each); whole command {wall:.0f} s")
    print(f"examples: {wavs[0]} ...; result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
