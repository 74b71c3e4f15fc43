"""benchmarks/tpu/run.sh plans its steps without a chip: `DRY=1` prints each step's command."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="run.sh is a bash script")


def dry(tmp_path, *words):
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path), "COMMIT": "abc1234"}
    return subprocess.run(["bash", "benchmarks/tpu/run.sh", *words], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_each_step_becomes_its_command(tmp_path):
    done = dry(tmp_path, "tests", "rest", "+", "bench", "cifar", "--scale", "0.25", "+", "probe", "decode_workers",
               "--workers", "13,12", "+", "recipe", "vision", "--seeds", "1", "+", "pytest", "tests/host")
    assert done.returncode == 0, done.stderr
    steps = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("== ")]
    results = f"env DATARAX_BENCH_RESULTS={tmp_path}/results DATARAX_BENCH_COMMIT=abc1234 python3"
    tests = ("env -u DATARAX_BENCH_RESULTS JAX_PLATFORMS=tpu,cpu DATARAX_TEST_JAX_CACHE=/tmp/datarax-tpu-test-cache "
             "python3 -m pytest -p no:xdist -p no:cacheprovider -q -rfE --tb=short --durations=40")
    assert steps == [
        f"{tests} tests/core tests/pipeline tests/control/test_device_copies.py tests/train/loop/test_fused.py",
        f"{results} -m benchmarks --no-progress cifar --scale 0.25",
        f"{results} benchmarks/tpu/decode_workers.py --workers 13,12",
        "python3 -m recipes.vision --seeds 1",
        f"{tests} tests/host",
    ]


def test_the_test_command_is_the_one_docs_tpu_md_gives(tmp_path):
    done = dry(tmp_path, "tests")
    paths = done.stdout.split("--durations=40 ", 1)[1].split()
    page = (ROOT / "docs" / "tpu.md").read_text()
    command = page.split("JAX_PLATFORMS=tpu,cpu python -m pytest ", 1)[1].split(" -p no:xdist", 1)[0]
    assert paths == command.replace("\\\n", " ").split()


@pytest.mark.parametrize("words, message", [
    (["probe", "nope"],
     "run.sh: probe takes one of probe userfn_probe dispatch_k decode_probe decode_workers decode_profile "
     "decode_threads decode_ceiling rrc_probe layout_probe"),
    (["tests", "some"], "run.sh: tests takes all, operators or rest, got 'some'"),
    (["bench", "cifar", "+", "walk"], "run.sh: unknown step 'walk'"),
])
def test_a_bad_step_stops_the_run_before_anything_runs(tmp_path, words, message):
    done = dry(tmp_path, *words)
    assert done.returncode == 2 and message in done.stderr
    assert "== " not in done.stdout


def test_every_probe_it_names_exists():
    script = (ROOT / "benchmarks" / "tpu" / "run.sh").read_text()
    names = script.split('PROBES=" ', 1)[1].split(' "', 1)[0].split()
    assert names and all((ROOT / "benchmarks" / "tpu" / f"{name}.py").is_file() for name in names)
