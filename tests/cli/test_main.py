"""The `datarax` command line, called in-process through `main(argv)`."""

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
from toml_jobs import write_job

from datarax.cli.main import main
from datarax.config import load_pipeline

HELPERS = '''
import numpy as np
import jax.numpy as jnp
from flax import nnx

def make_data():
    rng = np.random.default_rng(3)
    return {"image": rng.random((40, 8, 8, 3)).astype(np.float32), "label": np.arange(40, dtype=np.int32)}

def double(element, key=None):
    return element.update_data({"image": element.data["image"] * 2})

class Pair(nnx.Module):
    def __call__(self, big, small):
        return {"small": small["image"], "big": big["image"], "label": big["label"]}

def make_regression():
    rng = np.random.default_rng(0)
    x = rng.random((40, 4)).astype(np.float32)
    return {"x": x, "y": x @ np.array([1.0, -2.0, 3.0, 0.5], np.float32)}

def make_model(rngs):
    return nnx.Linear(4, 1, rngs=rngs)

def mse(model, batch):
    return jnp.mean((model(batch["x"])[:, 0] - batch["y"]) ** 2)
'''

PIPELINE = """
    allow = ["cli_helpers"]
    batch_size = 16
    [source.memory]
    data = "cli_helpers:make_data"
    [[stages]]
    resize = { size = [4, 6] }
    [[stages]]
    element = { fn = "cli_helpers:double" }
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "cli_helpers.py").write_text(HELPERS)
    return tmp_path


def write(folder, text, name="run.toml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith("datarax 0.1.0 (jax ")


def test_validate_accepts_a_good_file(folder, capsys):
    path = write(folder, PIPELINE)
    assert main(["validate", path]) == 0
    # It builds what it checks: the batch spec is the pipeline's (resize 8x8 -> 4x6, batch 16).
    assert capsys.readouterr().out.strip().splitlines() == [
        f"{path}: OK (memory source, 2 stage(s), batch_size 16)",
        "  batch: image: float32 (16, 4, 6, 3), label: int32 (16,)"]


def test_validate_exits_non_zero_with_one_line_per_problem(folder, capsys):
    text = PIPELINE.replace("size = [4, 6]", 'size = "big"').replace('"cli_helpers:double"', '"cli_helpers:double", '
                                                                                             'scale = 2')
    path = write(folder, text)
    assert main(["validate", path]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == ""
    assert lines[0].startswith(f"datarax: error: {path}: stages[0].resize.size must be")
    assert lines[1] == (f"datarax: error: {path}: stages[1].element.scale is not a known parameter of 'element' "
                        "(known: fn, rngs, stochastic, stream_name)")


@pytest.mark.parametrize("argv,words", [
    (["validate", "/nonexistent/run.toml"], "config file '/nonexistent/run.toml' does not exist"),
    (["bench", "no_such_scenario"], "unknown scenario(s) ['no_such_scenario']"),
    (["bench", "tokens", "--vs", "tf"], "unknown peer(s) ['tf'] in --vs; choose from grain, numpy, tfdata, torch"),
])
def test_bad_input_is_a_one_line_error(argv, words, capfd):
    assert main(argv) == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err


def test_usage_errors_exit_with_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


def test_set_overrides_reach_the_validated_config(folder, capsys):
    path = write(folder, PIPELINE)
    assert main(["validate", path, "--set", "batch_size=8"]) == 0
    out = capsys.readouterr().out
    assert "batch_size 8" in out and "override: batch_size = 8 (--set)" in out


def test_inspect_prints_per_stage_shapes_the_graph_and_the_fingerprint(folder, capsys):
    path = write(folder, PIPELINE)
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out.splitlines()
    # Expected shapes written from the config: batch 16, resize 8x8 -> 4x6, the element op keeps shapes.
    after_resize = out.index("  stages[0] resize (ResizeOperator)")
    assert out[after_resize + 1:after_resize + 3] == ["    image  float32 (16, 4, 6, 3)", "    label  int32 (16,)"]
    after_double = out.index("  stages[1] element (ElementOperator)")
    assert out[after_double + 1] == "    image  float32 (16, 4, 6, 3)"
    assert "  image  float32 (8, 8, 3)" in out  # the element spec, one record
    assert "     └─ stages[1] element (ElementOperator)  => output" in out
    assert out[-1] == f"fingerprint  {load_pipeline(path).fingerprint}"


def test_inspect_draws_a_dag(folder, capsys):
    path = write(folder, """
        batch_size = 8
        [source.memory]
        data = "cli_helpers:make_data"
        [dag]
        sink = "both"
        [dag.nodes.twice]
        element = { fn = "cli_helpers:double" }
        [dag.nodes.small]
        inputs = ["twice"]
        resize = { size = 4 }
        [dag.nodes.both]
        inputs = ["twice", "small"]
        "cli_helpers:Pair" = {}
    """)
    assert main(["inspect", path, "--allow", "cli_helpers"]) == 0
    out = capsys.readouterr().out.splitlines()
    graph = out[out.index("graph") + 1:-1]
    assert graph == ["  [source] MemorySource",
                     "  └─ twice (ElementOperator) <- source",
                     "     └─ small (ResizeOperator) <- twice",
                     "        └─ both (Pair) <- twice, small  => output"]
    assert out[out.index("  small (ResizeOperator)") + 1] == "    image  float32 (8, 4, 4, 3)"
    both = out.index("  both (Pair)")
    assert out[both + 1:both + 4] == ["    big    float32 (8, 8, 8, 3)", "    label  int32 (8,)",
                                      "    small  float32 (8, 4, 4, 3)"]


def test_run_reports_throughput_goodput_and_the_first_batch(folder, capsys):
    path = write(folder, PIPELINE.replace("batch_size = 16", "batch_size = 16\n    epochs = 2"))
    assert main(["run", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batches"] == 2 * math.ceil(40 / 16) and report["records"] == 80
    assert report["el_s"] > 0 and 0 < report["goodput"] < 1
    # The first batch of an unshuffled source is records 0..15, resized then doubled: label stats are exact.
    assert report["sample"]["label"] == {"dtype": "int32", "shape": [16], "min": 0.0, "max": 15.0, "mean": 7.5}
    assert report["sample"]["image"]["shape"] == [16, 4, 6, 3]
    assert main(["run", path, "--batches", "1"]) == 0
    text = capsys.readouterr().out
    assert "ran          1 batches, 16 records" in text and "goodput" in text


def test_train_then_resume_from_the_checkpoint(folder, capsys):
    path = write(folder, """
        allow = ["cli_helpers"]
        batch_size = 8
        [source.memory]
        data = "cli_helpers:make_regression"
        shuffle = true
        [trainer]
        model = "cli_helpers:make_model"
        loss = "cli_helpers:mse"
        optimizer = { adam = { learning_rate = 0.01 } }
        steps = 2
        checkpoint_dir = "ckpt"
    """)
    assert main(["train", path]) == 0
    first = capsys.readouterr().out
    assert "trained      to step 2 (target 2 steps)" in first and "resumed" not in first
    assert main(["train", path, "--set", "trainer.steps=3"]) == 0
    second = capsys.readouterr().out
    assert "resumed      from the checkpoint at step 2" in second
    assert "trained      to step 3 (target 3 steps)" in second
    assert sorted(p.name for p in (folder / "ckpt").iterdir() if p.name.isdigit()) == ["2", "3"]
    # The same run artefacts as the recipes, in runs/<config name> beside the config.
    run_dir = folder / "runs" / Path(path).stem
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["step"], result["resumed_from"], result["stop_reason"]) == (3, 2, None)
    assert result["metrics"]["loss"] == pytest.approx(float(second.split("loss ")[1].split()[0].rstrip(",")), rel=1e-5)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 3 and 2 in steps  # the final metrics of both runs
    goodput = json.loads((run_dir / "goodput.json").read_text())
    assert goodput["steps"] >= 1 and "diagnosis" in goodput


def test_train_without_a_trainer_section_says_what_to_add(folder, capsys):
    assert main(["train", write(folder, PIPELINE)]) == 1
    assert "trainer is missing: add a [trainer] table" in capsys.readouterr().err


def fake_peer(peer, recipe, *, repeats):
    return {"el_s": 1000.0, "el_s_runs": [1000.0] * repeats, "settings": f"fake {peer}"}


def test_bench_prints_one_row_per_framework_per_scenario(monkeypatch, capsys, tmp_path):
    from benchmarks.__main__ import main as bench_main
    from benchmarks.peers import runner

    monkeypatch.setattr(runner, "run_isolated", fake_peer)
    monkeypatch.setattr(runner, "installed", lambda peer: True)
    argv = ["tokens", "--vs", "grain,tfdata,torch", "--json", "--scale", "0.001", "--repeats", "1"]
    assert bench_main(argv) == 0  # `datarax bench` runs this in its own process
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    frameworks = ["datarax", "floor", "grain", "tfdata", "torch"]
    assert [(r["scenario"], r["framework"]) for r in rows] == [("tokens", f) for f in frameworks]
    by = {r["framework"]: r for r in rows}
    for peer in ("grain", "tfdata", "torch"):
        assert by[peer]["el_s"] == 1000.0 and by[peer]["settings"] == f"fake {peer}"
        assert by[peer]["ratio_to_datarax"] == pytest.approx(1000.0 / by["datarax"]["el_s"], rel=1e-3)
        assert by[peer]["ratio_to_floor"] == pytest.approx(1000.0 / by["floor"]["el_s"], rel=1e-3)
    assert by["datarax"]["ratio_to_floor"] == pytest.approx(by["datarax"]["el_s"] / by["floor"]["el_s"], rel=1e-3)
    assert by["datarax"]["records"] == 200


def test_bench_table_and_plot(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.__main__ import main as bench_main
    from benchmarks.peers import runner

    monkeypatch.setattr(runner, "run_isolated", fake_peer)
    monkeypatch.setattr(runner, "installed", lambda peer: peer != "tfdata")
    plot = tmp_path / "bench.png"
    assert bench_main(["tokens", "--vs", "torch,tfdata", "--scale", "0.001", "--repeats", "1",
                       "--plot", str(plot)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: ")
    assert out[1].split() == ["scenario", "framework", "el/s", "vs", "datarax", "vs", "floor", "notes"]
    assert out[4].split()[:3] == ["tokens", "torch", "1,000"]
    assert "tfdata is not installed" in out[5]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["version"], ["run", "--help"]])
def test_help_and_version_import_no_jax(argv):
    """`datarax --help`, `--version` and `version` answer without importing JAX (docs/cli.md has the time)."""
    import subprocess
    import sys

    code = ("import sys\nfrom datarax.cli.main import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print('JAX-IMPORTED' if any(m == 'jax' or m.startswith('jax.') for m in sys.modules) else 'NO-JAX')"
            % (argv,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip().splitlines()[-1] == "NO-JAX"
    if argv != ["run", "--help"]:
        assert "datarax 0.1.0 (jax " in out or "usage: datarax" in out


def test_the_plot_marks_missing_peers_instead_of_drawing_nothing():
    from benchmarks.report import plot_layout

    rows = [{"scenario": "tokens", "framework": "datarax", "el_s": 2000.0},
            {"scenario": "tokens", "framework": "floor", "el_s": 2100.0},
            {"scenario": "tokens", "framework": "tfdata", "error": "tfdata is not installed: pip install tensorflow"},
            {"scenario": "dag", "framework": "datarax", "el_s": 10.0},
            {"scenario": "dag", "framework": "torch", "skipped": "no torch workload for dag"}]
    scenarios, frameworks, rates, notes = plot_layout(rows)
    assert scenarios == ["tokens", "dag"] and frameworks == ["datarax", "floor", "tfdata", "torch"]
    assert rates == {("tokens", "datarax"): 2000.0, ("tokens", "floor"): 2100.0, ("dag", "datarax"): 10.0}
    assert notes == {("tokens", "tfdata"): "not installed", ("dag", "torch"): "no run"}


def test_both_benchmark_entry_points_print_one_schema(monkeypatch, capfd):
    from benchmarks import __main__ as suite
    from benchmarks.peers import runner

    monkeypatch.setattr(runner, "run_isolated", fake_peer)
    monkeypatch.setattr(runner, "installed", lambda peer: True)
    argv = ["tokens", "--json", "--scale", "0.001", "--repeats", "1"]
    assert main(["bench", *argv]) == 0  # `python -m benchmarks` in a process of its own: no fake peers there
    from_cli = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert suite.main([*argv, "--vs", "grain"]) == 0
    from_module = [json.loads(line) for line in capfd.readouterr().out.splitlines()]
    assert [sorted(r) for r in from_cli] == [sorted(r) for r in from_module[:2]]
    assert [(r["scenario"], r["framework"]) for r in from_module] == [("tokens", f) for f in
                                                                      ("datarax", "floor", "grain")]


# A configuration must not run code it was not allowed to: each attempt below names a standard-library
# callable (called with TOML arguments that would touch MARKER) or a module that touches MARKER when it
# is imported. Every command must refuse it at its TOML path, before importing or calling anything.
EVIL_MODULE = "import pathlib\npathlib.Path({marker!r}).touch()\ndef f(*a, **k):\n    return {{}}\n"
TRAINER = """
[trainer]
model = "cli_helpers:make_model"
loss = "cli_helpers:mse"
optimizer = { adam = { learning_rate = 0.01 } }
steps = 1
"""
BASE = 'batch_size = 8\n[source.memory]\ndata = "cli_helpers:make_regression"\n'
ATTACKS = {
    "stage": ("stages[0].\"os:system\"", BASE + '[[stages]]\n"os:system" = { command = "touch MARKER" }\n' + TRAINER),
    "element fn": ("stages[0].element.fn", BASE + '[[stages]]\nelement = { fn = "EVIL:f" }\n' + TRAINER),
    "source": ("source.\"os:system\"",
               '[source."os:system"]\ncommand = "touch MARKER"\n' + TRAINER),
    "source data": ("source.memory.data", '[source.memory]\ndata = "EVIL:f"\n' + TRAINER),
    "dag node": ("dag.nodes.a.\"subprocess:getoutput\"",
                 BASE + '[dag]\nsink = "a"\n[dag.nodes.a]\n"subprocess:getoutput" = { cmd = "touch MARKER" }\n'
                 + TRAINER),
    "trainer model": ("trainer.model", BASE + TRAINER.replace('"cli_helpers:make_model"', '"os:system"')
                      + 'model_args = { command = "touch MARKER" }\n'),
    "trainer loss": ("trainer.loss", BASE + TRAINER.replace('"cli_helpers:mse"', '"EVIL:f"')),
    "trainer optimizer": ("trainer.optimizer", BASE + TRAINER.replace('{ adam = { learning_rate = 0.01 } }',
                                                                      '"EVIL:f"')),
    "trainer metric": ("trainer.metrics.m", BASE + TRAINER + 'metrics = { m = "EVIL:f" }\n'),
    "trainer class": ("trainer.trainer_class", BASE + TRAINER + 'trainer_class = "EVIL:f"\n'),
    "callback": ("trainer.callbacks[0].\"subprocess:Popen\"",
                 BASE + TRAINER + 'callbacks = [{ "subprocess:Popen" = { args = ["touch", "MARKER"] } }]\n'),
    # An allowed module does not lend out what it imports: cli_helpers imports numpy, not its own code.
    "through an allowed module": ("stages[0].element.fn",
                                  'allow = ["cli_helpers"]\n' + BASE
                                  + '[[stages]]\nelement = { fn = "cli_helpers:np.save" }\n' + TRAINER),
}


@pytest.mark.parametrize("command", ["validate", "inspect", "run", "train"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_config_cannot_import_or_call_what_it_was_not_allowed(folder, capsys, attack, command):
    import sys
    import uuid

    marker = folder / "MARKER"
    evil = f"evil_{uuid.uuid4().hex[:12]}"  # a fresh name: a cached module would hide an import
    (folder / f"{evil}.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    where, text = ATTACKS[attack]
    path = write(folder, text.replace("MARKER", str(marker)).replace("EVIL", evil))
    path_before = list(sys.path)
    status = main([command, path] + (["--no-progress"] if command in ("run", "train") else []))
    err = capsys.readouterr().err
    assert not marker.exists(), f"{attack}: {command} ran code the configuration was not allowed to run"
    assert evil not in sys.modules
    assert sys.path == path_before
    assert status == 1
    assert f"{path}: {where} names " in err and "allow" in err, err


def _one_paragraph_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("datarax: error: ")
    return err


DATA_FILES = {  # name -> (bytes, the words the message must hold besides the file and the key)
    "garbage.npz": (b"PK\x03\x04" + b"not a zip archive" * 8, "cannot be read as a .npz archive"),
    "empty.npz": (b"", "is empty"),
    "pickled.npz": (b"garbage", "cannot be read as a .npz archive"),
    "empty.npy": (b"", "is empty"),
    "garbage.npy": (b"\x93NUMPY\x01\x00garbage", "cannot be read as a .npy array"),
}


@pytest.mark.parametrize("name", sorted(DATA_FILES))
def test_an_unreadable_data_file_is_a_message_naming_the_file_and_the_key(folder, capsys, name):
    content, words = DATA_FILES[name]
    (folder / name).write_bytes(content)
    data = f'"{name}"' if name.endswith(".npz") else f'{{ x = "{name}" }}'
    key = "source.memory.data" + ("" if name.endswith(".npz") else ".x")
    path = write(folder, f"[source.memory]\ndata = {data}\n")
    assert main(["run", path, "--no-progress"]) == 1
    err = _one_paragraph_error(capsys)
    assert f"{key} names '{name}'" in err and words in err and str(folder / name) in err


SIZES = [  # (top-level lines over the 40 records of make_data, the key, words of the message)
    ("batch_size = 1_000_000_000_000", "batch_size", "larger than the 40 records of an epoch"),
    ("batch_size = 100_000_000", "batch_size", "larger than the 40 records of an epoch"),
    ("batch_size = 41\ndrop_remainder = true", "batch_size", "larger than the 40 records of an epoch"),
    ("prefetch = 1_000_000_000_000", "prefetch", "must be an int in [1, 64]"),
    ("dispatch_ahead = 65", "dispatch_ahead", "must be an int in [0, 64]"),
    ("dispatch_ahead = -1", "dispatch_ahead", "must be an int in [0, 64]"),
]


@pytest.mark.parametrize("key, value", [("batch_size", 0), ("prefetch", 65), ("prefetch", 0), ("dispatch_ahead", 65)])
def test_a_top_level_key_fails_with_the_message_of_pipeline(folder, capsys, key, value):
    from datarax import Pipeline
    from datarax.sources import MemorySource, MemorySourceConfig

    source = MemorySource(MemorySourceConfig(), data={"x": np.zeros((8, 2), np.float32)})
    with pytest.raises((TypeError, ValueError)) as python:
        Pipeline(source, **{key: value})
    path = write(folder, f"{key} = {str(value).lower() if isinstance(value, bool) else value}\n" + npz_data(folder))
    assert main(["validate", path]) == 1
    assert f"{path}: {python.value}" in _one_paragraph_error(capsys)


def npz_data(folder) -> str:
    """The 40 records of `make_data` as `data.npz` beside the configs."""
    import numpy as np

    rng = np.random.default_rng(3)
    np.savez(folder / "data.npz", image=rng.random((40, 8, 8, 3)).astype(np.float32), label=np.arange(40,
                                                                                                      dtype=np.int32))
    return '[source.memory]\ndata = "data.npz"\n'


@pytest.mark.parametrize("lines,key,words", SIZES)
def test_absurd_sizes_are_rejected_up_front_naming_the_key(folder, capsys, lines, key, words):
    path = write(folder, f"{lines}\n" + npz_data(folder))
    for command in ("validate", "run") if key in ("prefetch", "dispatch_ahead") else ("run", "inspect"):
        assert main([command, path, "--no-progress"] if command == "run" else [command, path]) == 1
        err = _one_paragraph_error(capsys)
        assert f"{path}: {key} " in err and words in err


def test_batches_that_would_not_fit_in_memory_are_rejected_naming_the_key(folder, capsys, monkeypatch):
    from datarax.config import sizes

    # A record is 8*8*3 float32 and an int32 label (772 bytes) plus its int64 id: 16 rows in 2 device
    # batches need 24,960 bytes, and 2 more dispatched ahead (the default) 49,920.
    monkeypatch.setattr(sizes, "memory_bytes", lambda: 20_000)
    for ahead, needed, fits in ((0, "24.4 KiB", 12), (2, "48.8 KiB", 6)):
        path = write(folder, f"batch_size = 16\ndispatch_ahead = {ahead}\n" + npz_data(folder))
        assert main(["run", path, "--no-progress"]) == 1
        err = _one_paragraph_error(capsys)
        assert f"{path}: batch_size 16 with dispatch_ahead {ahead} needs about {needed}" in err, err
        assert "19.5 KiB of memory" in err and f"use a batch_size of at most {fits}" in err


def test_a_binary_config_file_is_a_message_naming_it(folder, capsys):
    path = folder / "binary.toml"
    path.write_bytes(bytes(range(256)))
    assert main(["validate", str(path)]) == 1
    err = _one_paragraph_error(capsys)
    assert f"'{path}' is not a TOML text file" in err


def test_bench_outside_a_checkout_says_where_to_run_it(monkeypatch, tmp_path, capsys):
    import datarax
    from datarax.cli.main import BENCH_FROM_CHECKOUT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datarax, "__file__", str(tmp_path / "site-packages" / "datarax" / "__init__.py"))
    assert main(["bench", "tokens"]) == 1
    assert BENCH_FROM_CHECKOUT in capsys.readouterr().err


def write_image_parquet(path, count: int = 12) -> None:
    """`count` 16x16 PNGs in an HF `Image` column and an int64 `label`."""
    import numpy as np

    from datarax.sources import write_hf_parquet

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(count)]
    write_hf_parquet(path, {"image": images, "label": np.arange(count, dtype=np.int64) % 3}, images=["image"])


TRIAL_HELPERS = '''
import numpy as np

def broken_dataset():
    raise ConnectionError("no network: cannot download 'mnist'")

def not_a_dataset():
    return {"image": [b"..."], "label": [0]}

def make_model(rngs):
    from flax import nnx
    return nnx.Linear(4, 1, rngs=rngs)

def loss_on_x(model, batch):
    return ((model(batch["x"])[:, 0] - batch["y"]) ** 2).mean()
'''
HF = '[source.hf]\nfiles = ["images.parquet"]\nencoded = ["image"]\ncache_dir = "hf-cache"\n'
DECODE = '[[stages]]\ndecode_image = { size = 8 }\n'
# What a new user's first configurations looked like, each of which `datarax validate` once called OK.
REJECTED = {
    "a host stage on a source without encoded fields": (
        '[source.memory]\ndata = "cli_helpers:make_data"\n' + DECODE,
        "stages[0].decode_image cannot take the records of source.memory: DecodeImage field 'image' must hold "
        "encoded images"),
    "an HF source pointing at missing files": (
        HF.replace("images.parquet", "missing.parquet") + DECODE,
        "source.hf.files[0] names 'missing.parquet', which does not exist"),
    "a dataset named as a string": (
        '[source.hf]\ndataset = "mnist"\nencoded = ["image"]\n' + DECODE,
        "source.hf.dataset must be an import path 'package.module:function' of a function returning the dataset "
        "(or of the object itself) or give files = [...] instead"),
    "a dataset whose function fails": (
        '[source.hf]\ndataset = "trial_helpers:broken_dataset"\n' + DECODE,
        "source.hf.dataset names 'trial_helpers:broken_dataset', which raised ConnectionError: no network"),
    "a dataset that is not a datasets object": (
        '[source.hf]\ndataset = "trial_helpers:not_a_dataset"\n' + DECODE,
        "source.hf could not be built: HFSource dataset must be a datasets.Dataset, got dict"),
    "encoded fields and no host stage": (
        HF, "stages: the records of source.hf still hold encoded fields ['image'] (bytes or text)"),
    "a host stage after a device stage": (
        HF + '[[stages]]\nto_float = {}\n' + DECODE,
        "stages[1].decode_image is a host stage after the device stage stages[0] (to_float)"),
    "a host stage in a DAG": (
        HF + '[dag]\nsink = "a"\n[dag.nodes.a]\ndecode_image = { size = 8 }\n',
        "dag.nodes.a.decode_image is a host stage, which cannot be a DAG node"),
    "a loss that does not fit the batch": (
        '[source.memory]\ndata = "cli_helpers:make_data"\n[trainer]\nmodel = "trial_helpers:make_model"\n'
        'loss = "trial_helpers:loss_on_x"\noptimizer = { adam = { learning_rate = 0.1 } }\nsteps = 1\n',
        "trainer.loss fails on the pipeline's output batch (image float32[8, 8, 8, 3], label int32[8]): KeyError"),
    "eval_every_steps without an [eval] table": (
        '[source.memory]\ndata = "cli_helpers:make_regression"\n[trainer]\nmodel = "trial_helpers:make_model"\n'
        'loss = "trial_helpers:loss_on_x"\noptimizer = { adam = { learning_rate = 0.1 } }\nsteps = 1\n'
        'eval_every_steps = 5\n',
        "trainer.eval_every_steps needs an evaluation pipeline: add an [eval] table"),
    "an [eval] table pointing at missing files": (
        HF + DECODE + '[eval.source.hf]\nfiles = ["test.parquet"]\n',
        "eval.source.hf.files[0] names 'test.parquet', which does not exist"),
}


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_validate_rejects_at_the_key_what_cannot_be_built(folder, capsys, case):
    (folder / "trial_helpers.py").write_text(TRIAL_HELPERS)
    write_image_parquet(folder / "images.parquet")
    text, words = REJECTED[case]
    path = write(folder, 'allow = ["cli_helpers", "trial_helpers"]\nbatch_size = 8\n' + text)
    assert main(["validate", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert f"datarax: error: {path}: {words}" in captured.err, captured.err


def test_validate_builds_a_host_stage_pipeline_from_parquet_files(folder, capsys):
    write_image_parquet(folder / "images.parquet")
    path = write(folder, 'batch_size = 4\n' + HF + DECODE + '[[stages]]\nto_float = {}\n')
    assert main(["validate", path]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: OK (hf source, 1 host stage(s) + 1 stage(s), batch_size 4)",
        "  batch: image: float32 (4, 8, 8, 3), label: int32 (4,)"]
    assert not (folder / "hf-cache").exists()  # validate read one batch of the parquet, not the dataset
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("  stages[0] decode_image (DecodeImage)  size=(8, 8)")
    assert out[at + 1:at + 4] == ["    runs on processes (auto: worker processes)", "    label  int64 ()",
                                  "    image  uint8 (8, 8, 3)"]
    assert "  label  int64 ()" in out and "  image  encoded (bytes or text)" in out  # the source's records
    assert "  └─ stages[0] decode_image (DecodeImage, on the host)" in out
    assert "     └─ stages[1] to_float (ToFloatOperator)  => output" in out


def test_train_over_a_materialized_cache(folder, capsys):
    """The decode-once cache as a source kind: `datarax materialize` writes it, a TOML job trains on it."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for label in ("a", "b"):
        (folder / "photos" / label).mkdir(parents=True)
        for i in range(6):
            photo = Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8))
            photo.save(folder / "photos" / label / f"{i}.png")
    assert main(["materialize", str(folder / "photos"), str(folder / "cache"), "--max-side", "16"]) == 0
    capsys.readouterr()
    (folder / "cache_helpers.py").write_text('''
def flat_model(rngs):
    from flax import nnx
    return nnx.Linear(8 * 8 * 3, 2, rngs=rngs)

def flat_loss(model, batch):
    import optax
    logits = model(batch["image"].reshape(batch["image"].shape[0], -1))
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
''')
    path = write(folder, """
        allow = ["cache_helpers"]
        batch_size = 4
        [source.materialized]
        directory = "cache"          # relative to this file
        max_side = 16
        shuffle = true
        source = { image_folder = { root = "photos" } }   # checked against the cache's manifest
        [[stages]]
        decode_image = { size = 8, crop = "random_resized", seed = 0 }
        [[stages]]
        to_float = {}
        [trainer]
        model = "cache_helpers:flat_model"
        loss = "cache_helpers:flat_loss"
        optimizer = { sgd = { learning_rate = 0.1 } }
        steps = 4
        checkpoint_dir = "ckpt"
    """)
    assert main(["validate", path]) == 0
    assert "OK (materialized source, 1 host stage(s) + 1 stage(s)" in capsys.readouterr().out
    assert main(["train", path, "--no-progress"]) == 0
    assert "trained      to step 4 (target 4 steps)" in capsys.readouterr().out
    result = json.loads((folder / "runs" / "run" / "result.json").read_text())
    assert result["step"] == 4 and math.isfinite(result["metrics"]["loss"])
    # A changed photo makes the cache stale: refused at the source's key, with the fix.
    Image.fromarray(np.zeros((40, 30, 3), np.uint8)).save(folder / "photos" / "a" / "0.png")
    assert main(["validate", path]) == 1
    err = capsys.readouterr().err
    assert f"{path}: source.materialized could not be built: the materialized cache" in err and "changed" in err


def test_a_second_train_with_another_learning_rate_is_refused_naming_it(folder, capsys):
    """The first run finished; a second one in the same checkpoint directory with another
    learning rate must not adopt its checkpoint. allow_config_change and on_damaged are keys."""
    path = write(folder, """
        allow = ["cli_helpers"]
        batch_size = 8
        [source.memory]
        data = "cli_helpers:make_regression"
        shuffle = true
        [trainer]
        model = "cli_helpers:make_model"
        loss = "cli_helpers:mse"
        optimizer = { adam = { learning_rate = 0.01 } }
        steps = 2
        checkpoint_dir = "ckpt"
        on_damaged = "refuse"
    """)
    assert main(["train", path]) == 0
    capsys.readouterr()
    assert main(["train", path, "--set", "trainer.optimizer.adam.learning_rate=0.05", "--set", "trainer.steps=3"]) == 1
    err = capsys.readouterr().err
    assert "trainer.optimizer.adam.learning_rate: saved 0.01, this run 0.05" in err
    assert "allow_config_change = true under [trainer]" in err
    assert main(["train", path, "--set", "trainer.optimizer.adam.learning_rate=0.05", "--set", "trainer.steps=3",
                 "--set", "trainer.allow_config_change=true"]) == 0
    assert "resumed      from the checkpoint at step 2" in capsys.readouterr().out
    assert main(["train", path, "--set", "trainer.on_damaged=maybe"]) == 1
    assert "trainer.on_damaged" in capsys.readouterr().err


KIT_KEYS = 'checkpoint_dir = "ckpt"\ncheckpoint_every = 1\nmax_to_keep = 1\n'
KIT_REJECTED = [  # (keys added to [trainer], the error after "<path>: ")
    ("accumulate_steps = 3", "trainer.accumulate_steps = 3 must divide batch_size = 8"),
    ('ema_decay = "high"', "trainer.ema_decay"),
    ('param_sharding = "fsdp"', "trainer.param_sharding = 'fsdp' lays the training state out over the pipeline's "
                                "mesh: add a [sharding] table"),
]


@pytest.mark.parametrize("keys, error", KIT_REJECTED, ids=[k for k, _ in KIT_REJECTED])
def test_validate_rejects_bad_training_kit_options_at_their_key(folder, capsys, keys, error):
    path = str(write_job(folder, KIT_KEYS + keys, steps=6))
    assert main(["validate", path]) == 1
    assert f"datarax: error: {path}: {error}" in capsys.readouterr().err


SAME_AS_PYTHON = [  # (keys added to [trainer], who checks them in Python, its keyword arguments)
    ("accumulate_steps = 0", "Trainer", {"accumulate_steps": 0}),
    ("ema_decay = 1.5", "Trainer", {"ema_decay": 1.5}),
    ("ema_decay = 1.0", "Trainer", {"ema_decay": 1.0}),
    ('precision = "fp8"', "Trainer", {"precision": "fp8"}),
    ('param_sharding = "zero3"', "Trainer", {"param_sharding": "zero3"}),
    ("max_to_keep = 0", "Checkpointer", {"max_to_keep": 0}),
    ('on_damaged = "ignore"', "CheckpointCallback", {"on_damaged": "ignore"}),
    ("keep_best = 2", "CheckpointCallback", {"keep_best": 2}),
    ('best_metric = "eval/loss"', "CheckpointCallback", {"best_metric": "eval/loss"}),
    ('keep_best = 0\nbest_metric = "eval/loss"', "CheckpointCallback", {"keep_best": 0, "best_metric": "eval/loss"}),
    ('keep_best = 2\nbest_metric = "loss"', "CheckpointCallback", {"keep_best": 2, "best_metric": "loss"}),
    ('best_mode = "lowest"', "CheckpointCallback", {"best_mode": "lowest"}),
]


@pytest.mark.parametrize("keys, owner, kwargs", SAME_AS_PYTHON, ids=[k for k, _, _ in SAME_AS_PYTHON])
def test_a_trainer_key_fails_with_the_message_of_its_python_argument(folder, capsys, keys, owner, kwargs):
    import optax
    from trainer_helpers import loss_fn, make_setup

    from datarax.train import Checkpointer, Trainer
    from datarax.train.callbacks import CheckpointCallback

    with pytest.raises((TypeError, ValueError)) as python:
        if owner == "Trainer":
            setup = make_setup()
            Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, **kwargs)
        else:
            {"Checkpointer": Checkpointer, "CheckpointCallback": CheckpointCallback}[owner](str(folder / "py"),
                                                                                            **kwargs)
    path = str(write_job(folder, KIT_KEYS.replace("max_to_keep = 1\n", "") + keys, steps=6))
    assert main(["validate", path]) == 1
    assert f"datarax: error: {path}: trainer.{python.value}" in capsys.readouterr().err


FOLDER_HELPERS = '''
import numpy as np

def make_model(rngs, width: int = 4):
    from flax import nnx
    return nnx.Linear(width, 1, rngs=rngs)
'''
# What `train` once rejected only after the run began (or with a second, confusing line): each is
# rejected by `validate`, at its key, with exactly one line. (job keys, steps, tables after, the error)
FRICTIONS = [
    ('optimizer = { adam = { learning_rate = "3e-3" } }', 4, "",
     "trainer.optimizer.adam.learning_rate must be a number or an import path 'package.module:function', got '3e-3'"),
    ("", 200.5, "", "trainer.steps must be an integer, got 200.5"),
    ('model = "folder_helpers:make_model"\nmodel_args = { width = "4" }', 4, "",
     "trainer.model_args.width must be an integer, got '4'"),
    ('model = "folder_helpers:make_model"\nmodel_args = { depth = 2 }', 4, "",
     "trainer.model_args.depth is not a known parameter of 'folder_helpers:make_model'"),
    ("optimizer = { sgd = { learning_rate = 0.1, momentum = 0.9, nesterov = 1 } }", 4, "",
     "trainer.optimizer.sgd.nesterov must be true or false, got 1"),
    # optax types momentum as a number that may be a bool: true would train at a momentum of 1.0
    ("optimizer = { sgd = { learning_rate = 0.1, momentum = true } }", 4, "",
     "trainer.optimizer.sgd.momentum must be a number, got True"),
    ("eval_every_steps = 2", 4, '[eval]\n[eval.source.image_folder]\nroot = "no-such-folder"\n',
     "eval.source.image_folder"),
]


@pytest.mark.parametrize("keys, steps, after, error", FRICTIONS, ids=[f[3][:40] for f in FRICTIONS])
def test_validate_rejects_each_friction_at_its_key_in_one_line(folder, capsys, keys, steps, after, error):
    (folder / "folder_helpers.py").write_text(FOLDER_HELPERS)
    path = write_job(folder, keys, steps=steps, after=after)
    text = path.read_text().replace('allow = ["job_helpers"]', 'allow = ["job_helpers", "folder_helpers"]')
    if "optimizer = {" in keys:  # the job's own optimizer line gives way to the one under test
        text = text.replace("optimizer = { adam = { learning_rate = 0.01 } }\n", "", 1)
    if "model = " in keys:
        text = text.replace('model = "job_helpers:make_model"\n', "", 1)
    path.write_text(text)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("datarax: error:")]
    assert len(lines) == 1 and f"datarax: error: {path}: {error}" in lines[0], err


EVAL_HELPERS = '''
import numpy as np

def eval_records():
    rng = np.random.default_rng(1)
    x = rng.random((150, 4)).astype(np.float32)
    return {"x": x, "y": np.arange(150, dtype=np.float32)}

def mean_y(batch, aux):
    return batch["y"].mean()
'''


def test_eval_scores_every_record_whatever_the_training_pipeline_drops(folder, capsys):
    """Training drops its short final batch (drop_remainder = true at the top); [eval] does not inherit
    that: 150 records at batch 32 are all scored (a batch-weighted mean of y is numpy's mean of all 150)."""
    (folder / "eval_helpers.py").write_text(EVAL_HELPERS)
    path = write_job(folder, 'metrics = { mean_y = "eval_helpers:mean_y" }', steps=4,
                     after='[eval]\nbatch_size = 32\n[eval.source.memory]\ndata = "eval_helpers:eval_records"\n')
    path.write_text(path.read_text().replace('allow = ["job_helpers"]', 'allow = ["job_helpers", "eval_helpers"]\n'
                                                                        'drop_remainder = true'))
    assert main(["train", str(path), "--no-progress"]) == 0
    assert "(150 records)" in capsys.readouterr().out
    result = json.loads((folder / "runs" / "run" / "result.json").read_text())
    assert result["eval_records"] == 150
    assert result["eval_metrics"]["mean_y"] == pytest.approx(np.arange(150).mean(), rel=1e-6)


def test_validate_shows_the_guardrail_warnings_in_the_files_terms_and_train_repeats_them(folder, capsys):
    """An unshuffled source and a batch size that leaves a short final batch: `validate` says both
    (the file is still OK), as one line each, naming the keys to set; `train` says the same."""
    path = write_job(folder, steps=2)
    path.write_text(path.read_text().replace("shuffle = true\n", "").replace("batch_size = 8", "batch_size = 12"))
    assert main(["validate", str(path)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("datarax: warning:")]
    assert len(lines) == 2 and len(err.splitlines()) == 2, err  # one line each, no source line under them
    short, unshuffled = sorted(lines)
    assert short.startswith("datarax: warning: ShortFinalBatchWarning: the training pipeline's epoch of 40 records "
                            "ends in a short batch of 4 (batch_size=12)")
    assert "Fix: drop_remainder = true at the top of the file (drops 4 records per epoch" in short
    assert "UnshuffledTrainingWarning: the training pipeline reads MemorySource in the same order every epoch" in \
        unshuffled and "Fix: set shuffle = true (and seed = 0) in the [source.<name>] table" in unshuffled
    assert main(["train", str(path), "--no-progress"]) == 0
    assert sorted(line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("datarax: warning:")) == sorted(lines)


def test_train_takes_accumulation_ema_precision_and_best_k_from_the_file(folder, capsys):
    keys = 'accumulate_steps = 2\nema_decay = 0.9\nprecision = "bf16"\nkeep_best = 2\nbest_metric = "train/loss"\n'
    path = str(write_job(folder, KIT_KEYS + keys, steps=6))
    assert main(["validate", path]) == 0
    assert main(["train", path, "--no-progress"]) == 0
    result = json.loads((folder / "runs" / "run" / "result.json").read_text())
    assert result["step"] == 6 and math.isfinite(result["metrics"]["loss"])
    from datarax.train.checkpointing.checkpointer import Checkpointer

    ckpt = Checkpointer(folder / "ckpt", keep_best=2, best_metric="train/loss")
    steps = ckpt.steps()
    meta = {s: ckpt.read_metadata(s)[0] for s in steps}
    ckpt.close()
    # The newest and the two best by the train loss logged at each save (step 1's save has none yet).
    losses = {s: m["best_metric"]["train/loss"] for s, m in meta.items() if m["best_metric"]}
    assert 6 in steps and len(steps) <= 3 and set(steps) - {6} <= set(sorted(losses, key=losses.get)[:2])
    assert all((folder / "ckpt" / str(s) / "ema").is_dir() for s in steps)
    assert all(m["run_config"]["trainer.precision"] == "'bf16'" for m in meta.values())


def test_train_takes_fsdp_from_the_file_and_resumes_on_another_mesh(folder, capsys):
    """`param_sharding = "fsdp"` over a [sharding] mesh of 8 fake devices; the run then goes on from
    the same checkpoint over a 4 x 2 mesh, its state cut 4 ways along "data" (the layout is not part
    of the checked configuration)."""
    import jax

    keys = KIT_KEYS + 'param_sharding = "fsdp"'
    path = str(write_job(folder, keys, steps=4, after="[sharding]\nmesh_shape = [8]\n"))
    assert main(["validate", path]) == 0
    assert main(["train", path, "--no-progress"]) == 0
    path = str(write_job(folder, keys, steps=6,
                         after='[sharding]\nmesh_shape = [4, 2]\naxis_names = ["data", "model"]\n'
                               'batch_axes = "data"\n'))
    assert main(["train", path, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "resumed      from the checkpoint at step 4" in out and "trained      to step 6" in out
    assert len(jax.devices()) == 8
