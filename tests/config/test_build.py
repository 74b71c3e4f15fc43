"""Configurations build the same pipelines as Python code does; every schema error names its path."""

import itertools
import os
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

import datarax.train  # noqa: F401 - imported for its side effect (registers the [trainer] table, which the kit validates)
from datarax import Pipeline
from datarax.config import ConfigError, load_pipeline, load_spec
from datarax.operators.image import BrightnessConfig, BrightnessOperator, HorizontalFlipConfig, HorizontalFlipOperator
from datarax.operators.strategies import ParallelOperator, ParallelOperatorConfig
from datarax.samplers.simple import ShuffleSampler
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.sources.hf import HFSource, HFSourceConfig

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")

HELPERS = '''
import numpy as np

def make_data():
    rng = np.random.default_rng(7)
    return {"image": rng.random((40, 8, 8, 3)).astype(np.float32),
            "label": np.arange(40, dtype=np.int32)}

def double(element, key=None):
    return element.update_data({"image": element.data["image"] * 2})

NOT_CALLABLE = 3

def make_model(rngs):
    from flax import nnx
    return nnx.Linear(3, 1, rngs=rngs)

def mse(model, batch):
    return ((model(batch["image"][:, 0, 0, :])[:, 0] - batch["label"]) ** 2).mean()
'''


@pytest.fixture
def helpers(tmp_path):
    """A user module `cfg_helpers` beside the config files, importable by path from them."""
    (tmp_path / "cfg_helpers.py").write_text(HELPERS)
    yield tmp_path


def write(folder, text, name="run.toml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def same_stream(reference: Pipeline, built: Pipeline, max_batches: int | None = None) -> int:
    """Asserts `built` yields the batches `reference` yields next (same fingerprint); returns the count."""
    assert built.fingerprint == reference.fingerprint
    ref = iter(reference)
    it = built.epochs(None)
    it.set_state(ref.get_state())
    count = 0
    for a in itertools.islice(ref, max_batches):
        b = next(it)
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
        count += 1
    return count


QUICKSTART_TOML = """
    batch_size = 32

    [source.memory]
    data = "quickstart:data"
    rngs = 0

    [[stages]]
    element = { fn = "quickstart:normalize", stochastic = false, rngs = 0 }

    [[stages]]
    element = { fn = "quickstart:augment", stochastic = true, stream_name = "augmentations", rngs = 42 }
"""


def test_a_toml_equivalent_to_the_quickstart_yields_its_batches(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import quickstart  # runs examples/quickstart.py, the README Quick Start, verbatim

    built = load_pipeline(write(tmp_path, QUICKSTART_TOML), allow=["quickstart"])
    # The final short batch (1000 = 31 * 32 + 8) is padded inside the program: compare it too.
    assert same_stream(quickstart.pipeline, built) == len(quickstart.pipeline) == 32


def test_a_toml_dag_equivalent_to_the_dag_example_yields_its_batches(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import dag  # runs examples/dag.py

    built = load_pipeline(write(tmp_path, """
        batch_size = 32
        [source.memory]
        data = "dag:data"
        rngs = 0
        [dag]
        sink = "merge"
        [dag.nodes.augment]
        element = { fn = "dag:augment", stochastic = true, stream_name = "augmentations", rngs = 42 }
        [dag.nodes.normalize]
        element = { fn = "dag:normalize", rngs = 0 }
        [dag.nodes.merge]
        inputs = ["augment", "normalize"]
        "dag:Merge" = {}
    """), allow=["dag"])
    assert same_stream(dag.complex_pipeline, built, max_batches=4) == 4


def test_built_in_operators_nested_operators_and_a_sampler(helpers):
    built = load_pipeline(write(helpers, """
        allow = ["cfg_helpers"]
        batch_size = 16
        drop_remainder = true
        [source.memory]
        data = "cfg_helpers:make_data"
        [sampler.shuffle]
        seed = 3
        [[stages]]
        element = { fn = "cfg_helpers:double" }
        [[stages]]
        [stages.parallel]
        merge = "mean"
        fields = ["image"]
        operators = [ { brightness = { max_delta = 0.3, rngs = 5 } },
                      { horizontal_flip = { stochastic = false } } ]
    """))
    import cfg_helpers

    from datarax.operators import ElementOperator

    data = cfg_helpers.make_data()
    branches = [BrightnessOperator(BrightnessConfig(max_delta=0.3), rngs=nnx.Rngs(5)),
                HorizontalFlipOperator(HorizontalFlipConfig(stochastic=False))]
    reference = Pipeline(MemorySource(MemorySourceConfig(), data=data),
                         [ElementOperator(fn=cfg_helpers.double),
                          ParallelOperator(ParallelOperatorConfig(merge="mean", fields=("image",)),
                                           operators=branches)],
                         16, sampler=ShuffleSampler(40, seed=3), drop_remainder=True)
    assert isinstance(built.sampler, ShuffleSampler) and len(built.sampler) == 40
    assert same_stream(reference, built) == 2


def test_source_data_from_npz_and_npy_files(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.random((10, 3)).astype(np.float32), np.arange(10, dtype=np.int32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    for data in ('"d.npz"', '{ x = "x.npy", y = "y.npy" }'):
        pipeline = load_pipeline(write(tmp_path, f"batch_size = 10\n[source.memory]\ndata = {data}\n"))
        batch = next(iter(pipeline))
        np.testing.assert_array_equal(batch["x"], x)
        np.testing.assert_array_equal(batch["y"], y)


def test_sharding_lays_batches_over_the_mesh(helpers):
    pipeline = load_pipeline(write(helpers, """
        allow = ["cfg_helpers"]
        batch_size = 16
        drop_remainder = true
        [source.memory]
        data = "cfg_helpers:make_data"
        [sharding]
        mesh_shape = [4, 2]
        axis_names = ["data", "model"]
        batch_axes = "data"
    """))
    batch = next(iter(pipeline))
    assert batch["image"].sharding.spec[0] == "data"
    assert len(batch["image"].sharding.device_set) == len(jax.devices()) == 8


def test_environment_and_set_overrides_change_the_built_pipeline(helpers):
    path = write(helpers, 'allow = ["cfg_helpers"]\nbatch_size = 16\n[source.memory]\ndata = "cfg_helpers:make_data"\n')
    assert load_pipeline(path, environ={"DATARAX_BATCH_SIZE": "8"}).batch_size == 8
    assert load_pipeline(path, environ={"DATARAX_BATCH_SIZE": "8"}, overrides=["batch_size=4"]).batch_size == 4


SOURCE = '[source.memory]\ndata = "cfg_helpers:make_data"\n'

# (toml, a regex the error must match: the TOML path first, then what is wrong)
ERRORS = [
    ('[source.memory]\ndata = "cfg_helpers:make_data"\n[[stages]]\nbrightness = { max_delta = "high" }\n',
     r"stages\[0\]\.brightness\.max_delta must be a number, got 'high'"),
    (SOURCE + "[[stages]]\nbrightness = { max_detla = 0.3 }\n",
     r"stages\[0\]\.brightness\.max_detla is not a known parameter of 'brightness'; did you mean 'max_delta'\?"),
    ("batchsize = 3\n" + SOURCE, r"batchsize is not a known key; did you mean 'batch_size'\?"),
    (SOURCE + "batch_size = 3\n",
     r"source\.memory\.batch_size is a top-level key, but it sits in the \[source\.memory\] table"),
    (SOURCE + "[[stages]]\nbrightness = {}\nseed = 3\n",
     r"stages\[0\]\.seed is a top-level key, but it sits in the \[stages\[0\]\] table"),
    (SOURCE + "[[stages]]\nbrightnes = {}\n", r"stages\[0\]\.brightnes is not a known stage; did you mean "
                                              r"'brightness'\?"),
    ('[source.memroy]\ndata = "cfg_helpers:make_data"\n', r"source\.memroy is not a known source; did you mean "
                                                          r"'memory'\?"),
    (SOURCE + "[[stages]]\nelement = {}\n", r"stages\[0\]\.element\.fn is required by 'element' but missing"),
    (SOURCE + "[[stages]]\nbrightness = {}\ncontrast = {}\n",
     r"stages\[0\] must name exactly one stage .*got keys \['brightness', 'contrast'\]"),
    (SOURCE + "[[stages]]\nbrightness = 3\n", r"stages\[0\]\.brightness must be a table of parameters"),
    (SOURCE + "[[stages]]\nbrightness = { max_delta = 3.0 }\n",
     r"stages\[0\]\.brightness\.max_delta is rejected by BrightnessConfig: BrightnessConfig\.max_delta must be in"),
    (SOURCE + '[[stages]]\nelement = { fn = "cfg_helpers:dobule" }\n',
     r"stages\[0\]\.element\.fn names 'cfg_helpers:dobule', which cannot be imported: .*did you mean 'double'\?"),
    (SOURCE + '[[stages]]\nelement = { fn = "cfg_helpers:NOT_CALLABLE" }\n',
     r"stages\[0\]\.element\.fn names 'cfg_helpers:NOT_CALLABLE', which is an integer \(int\), not a callable"),
    (SOURCE + '[[stages]]\nelement = { fn = "cfg_helpers.double" }\n',
     r"stages\[0\]\.element\.fn names 'cfg_helpers\.double', which cannot be imported: import path "
     r"'cfg_helpers\.double' is not of the form 'package\.module:attribute'"),
    ("batch_size = 0\n" + SOURCE, r"batch_size must be a positive int, got 0"),
    ("batch_size = 4\n", r"source is required but missing"),
    ('[source.memory]\ndata = "missing.npz"\n', r"source\.memory\.data names 'missing\.npz', which does not exist"),
    ('[source.memory]\ndata = "x.npy"\n', r"source\.memory\.data names one array file 'x\.npy'"),
    (SOURCE + "[[stages]]\nbrightness = {}\n[dag]\nsink = \"a\"\n[dag.nodes.a]\nbrightness = {}\n",
     r"dag cannot be combined with device stages"),
    (SOURCE + '[dag]\nsink = "b"\n[dag.nodes.a]\ninputs = ["c"]\nbrightness = {}\n',
     r"dag\.nodes\.a\.inputs\[0\] names unknown node 'c'"),
    (SOURCE + '[dag]\nsink = "b"\n[dag.nodes.a]\nbrightness = {}\n', r"dag\.sink names unknown node 'b'"),
    (SOURCE + '[dag]\nsink = "a"\n[dag.nodes.a]\ninputs = ["b"]\nbrightness = {}\n'
              '[dag.nodes.b]\ninputs = ["a"]\nbrightness = {}\n', r"dag\.nodes form a cycle \(a -> b -> a\)"),
    (SOURCE + '[dag]\nsink = "a"\n[dag.nodes.a]\nbrightness = {}\n[dag.nodes.b]\nbrightness = {}\n',
     r"dag\.nodes\.b does not lead to the sink 'a'"),
    (SOURCE + '[sampler.shufle]\n', r"sampler\.shufle is not a known sampler; did you mean 'shuffle'\?"),
    (SOURCE + '[sharding]\nbatch_axes = "model"\n', r"sharding\.batch_axes names axis 'model'"),
    (SOURCE + '[trainer]\nmodel = "cfg_helpers:double"\nloss = "cfg_helpers:double"\n'
              'optimizer = { adamm = { learning_rate = 0.1 } }\nsteps = 3\n',
     r"trainer\.optimizer\.adamm is not an optax function; did you mean 'adam'\?"),
    (SOURCE + '[trainer]\nmodel = "cfg_helpers:double"\nloss = "cfg_helpers:double"\n'
              'optimizer = { adam = { learning_rate = 0.1 } }\n',
     r"trainer\.steps give exactly one of steps or epochs"),
]


@pytest.mark.parametrize("toml,pattern", ERRORS)
def test_every_schema_error_names_its_toml_path(helpers, toml, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_spec(write(helpers, toml), allow=["cfg_helpers"])


def test_all_problems_are_reported_together(helpers):
    path = write(helpers, 'batchsize = 3\nseed = "x"\n' + SOURCE + '[[stages]]\nbrightness = { max_delta = "high" }\n')
    with pytest.raises(ConfigError) as info:
        load_spec(path, allow=["cfg_helpers"])
    assert [p.split(" ")[0] for p in info.value.problems] == ["batchsize", "seed", "stages[0].brightness.max_delta"]
    assert str(info.value).startswith(f"{path}: 3 problems:")


def test_a_constructor_error_at_build_names_the_component(helpers):
    path = write(helpers, SOURCE + "[[stages]]\nnormalize = { mean = [0.5, 0.5], std = [1.0] }\n")
    with pytest.raises(ConfigError, match=r"stages\[0\]\.normalize"):
        load_pipeline(path, allow=["cfg_helpers"])


def test_a_trainer_section_builds_the_trainer_with_its_callbacks(helpers):
    from datarax.train import build_trainer

    spec = load_spec(write(helpers, SOURCE + """
        [trainer]
        model = "cfg_helpers:make_model"
        loss = "cfg_helpers:mse"
        optimizer = [{ clip_by_global_norm = { max_norm = 1.0 } }, { sgd = { learning_rate = 0.1 } }]
        epochs = 2
        checkpoint_dir = "ckpt"
        checkpoint_every = 5
        callbacks = [{ early_stopping = { monitor = "train/loss", patience = 7 } }]
    """.replace("\n        ", "\n")), allow=["cfg_helpers"])
    run = build_trainer(spec)
    kinds = {type(cb).__name__: cb for cb in run.trainer.callbacks}
    assert kinds["EarlyStopping"].patience == 7
    assert kinds["CheckpointCallback"].directory == str(helpers / "ckpt")
    assert kinds["CheckpointCallback"].schedule.every_steps == 5
    assert (run.num_steps, run.num_epochs) == (None, 2)
    assert run.trainer.model.in_features == 3


EVAL = """
    allow = ["cfg_helpers"]
    batch_size = 16
    [source.memory]
    data = "cfg_helpers:make_data"
    shuffle = true
    seed = 4
    [sampler.shuffle]
    seed = 3
    [[stages]]
    brightness = { max_delta = 0.3, rngs = 1 }
    [eval]
    batch_size = 10
    [[eval.stages]]
    element = { fn = "cfg_helpers:double" }
"""


def test_an_eval_table_overrides_the_training_pipeline(helpers):
    from datarax.config import build_pipeline
    from datarax.operators import ElementOperator

    spec = load_spec(write(helpers, EVAL))
    import cfg_helpers

    # batch_size and stages from [eval]; the source from the training table but in stored order
    # (shuffle = false); no training sampler (an evaluation visits each record once).
    reference = Pipeline(MemorySource(MemorySourceConfig(shuffle=False, seed=4), data=cfg_helpers.make_data()),
                         [ElementOperator(fn=cfg_helpers.double)], batch_size=10)
    evaluation = build_pipeline(spec.eval)
    assert evaluation.sampler.structure() == "SequentialSampler"
    assert same_stream(reference, evaluation) == 4
    assert isinstance(build_pipeline(spec).sampler, ShuffleSampler)  # the training pipeline keeps its own


@pytest.mark.parametrize("text,problems", [
    # A problem of the [eval] table is reported under eval.; one it inherits is reported once, at the training key.
    (EVAL.replace('fn = "cfg_helpers:double"', 'fn = "cfg_helpers:double", scale = 2'),
     ["eval.stages[0].element.scale is not a known parameter of 'element'"]),
    (EVAL.replace("max_delta = 0.3", 'max_delta = "x"').replace("[[eval.stages]]\n    element = { fn = "
                                                                "\"cfg_helpers:double\" }\n", ""),
     ["stages[0].brightness.max_delta must be a number, got 'x'"]),
    (EVAL.replace("[eval]", "[eval]\n    epochs = 3"), ["eval.epochs is not a known key"]),
    (EVAL.replace("[eval]\n    batch_size = 10", "[eval]\n    batch_size = 100"), []),
])
def test_eval_problems_are_reported_at_their_key_once(helpers, text, problems):
    path = write(helpers, text)
    if not problems:  # a size problem of the eval pipeline shows when it is built
        from datarax.config import build_pipeline

        with pytest.raises(ConfigError, match=r"batch_size 100 is larger than the 40 records of an epoch"):
            build_pipeline(load_spec(path).eval)
        return
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert len(info.value.problems) == len(problems)
    for got, words in zip(info.value.problems, problems):
        assert got.startswith(words), got


def test_the_trainer_evaluates_the_eval_pipeline_at_the_end(helpers):
    from datarax.train import build_trainer

    spec = load_spec(write(helpers, """
        allow = ["cfg_helpers"]
        batch_size = 8
        [source.memory]
        data = "cfg_helpers:make_data"
        shuffle = true
        [eval]
        batch_size = 10
        [trainer]
        model = "cfg_helpers:make_model"
        loss = "cfg_helpers:mse"
        optimizer = { sgd = { learning_rate = 0.01 } }
        steps = 7
    """))
    run = build_trainer(spec)
    result = run.fit()
    assert result.step == 7
    import cfg_helpers

    # The eval loss is the mean over the 40 records of the final model's squared error, in numpy.
    data = cfg_helpers.make_data()
    model = run.trainer.model
    x = data["image"][:, 0, 0, :].astype(np.float64)
    prediction = x @ np.asarray(model.kernel[...], np.float64)[:, 0] + float(model.bias[...][0])
    expected = float(np.mean((prediction - data["label"]) ** 2))
    assert result.eval_metrics["loss"] == pytest.approx(expected, rel=1e-5)


def test_host_stages_run_before_a_dag(tmp_path):
    import io

    from PIL import Image

    from datarax.host import DecodeImage
    from datarax.operators import ToFloatOperator

    images = []
    for i in range(6):
        buffer = io.BytesIO()
        Image.fromarray(np.full((12, 10, 3), 40 * i, np.uint8)).save(buffer, format="PNG")
        images.append(buffer.getvalue())
    (tmp_path / "dag_helpers.py").write_text(textwrap.dedent("""
        import numpy as np
        from flax import nnx

        IMAGES = %r

        def data():
            return {"label": np.arange(6, dtype=np.int32)}

        class Both(nnx.Module):
            def __call__(self, a, b):
                return {"image": a["image"] + b["image"], "label": a["label"]}
    """ % (images,)))
    path = write(tmp_path, """
        allow = ["dag_helpers"]
        batch_size = 3
        [source.hf]
        dataset = "dag_helpers:dataset"
        encoded = ["image"]
        [[stages]]
        decode_image = { size = 4, resize = "fixed" }
        [dag]
        sink = "both"
        [dag.nodes.a]
        to_float = {}
        [dag.nodes.b]
        to_float = {}
        [dag.nodes.both]
        inputs = ["a", "b"]
        "dag_helpers:Both" = {}
    """)
    with open(tmp_path / "dag_helpers.py", "a") as f:
        f.write("\n\ndef dataset():\n    import datasets\n    return datasets.Dataset.from_dict("
                "{'image': IMAGES, 'label': list(range(6))})\n")
    built = load_pipeline(path)
    import dag_helpers

    reference = Pipeline.from_dag(
        source=HFSource(HFSourceConfig(encoded=("image",)), dataset=dag_helpers.dataset()),
        nodes={"a": ToFloatOperator(), "b": ToFloatOperator(), "both": dag_helpers.Both()},
        edges={"a": [], "b": [], "both": ["a", "b"]}, sink="both", batch_size=3,
        host_stages=[DecodeImage(size=4, resize="fixed")])
    assert same_stream(reference, built) == 2
    first = next(iter(built))["image"]
    np.testing.assert_allclose(np.asarray(first)[:, 0, 0, 0], 2 * 40 * np.arange(3) / 255.0, rtol=1e-6)


def test_a_host_map_stage_names_an_allowed_function(tmp_path):
    from datarax.host import HostMap

    (tmp_path / "map_helpers.py").write_text(textwrap.dedent("""
        import numpy as np

        def data():
            return {"x": np.arange(40, dtype=np.int32).reshape(10, 4)}

        def summary(record, rng):
            return {"summary": np.array([record["x"].sum(), record["x"].max(), rng.integers(0, 100)], np.int64)}
    """))
    path = write(tmp_path, """
        allow = ["map_helpers"]
        batch_size = 4
        [source.memory]
        data = "map_helpers:data"
        device_resident = false
        [[stages]]
        [stages.host_map]
        fn = "map_helpers:summary"
        outputs = [["summary", [3], "int64"]]
        fields = ["x"]
        stochastic = true
        seed = 2
    """)
    built = load_pipeline(path)
    import map_helpers

    reference = Pipeline(MemorySource(MemorySourceConfig(device_resident=False), data=map_helpers.data()),
                         [HostMap(fn=map_helpers.summary, outputs={"summary": ((3,), np.int64)}, fields=("x",),
                                  stochastic=True, seed=2)], batch_size=4)
    assert same_stream(reference, built) == 3
    x = map_helpers.data()["x"]
    first = next(iter(built))["summary"]
    np.testing.assert_array_equal(np.asarray(first)[:, :2], np.stack([x[:4].sum(1), x[:4].max(1)], 1))


def test_retry_policy_is_a_key(helpers):
    from datarax.control.retry import RetryPolicy

    base = """
        allow = ["cfg_helpers"]
        batch_size = 4
        [source.memory]
        data = "cfg_helpers:make_data"
    """
    built = load_pipeline(write(helpers, base.replace("batch_size = 4", "batch_size = 4\n        retry_policy = "
                                                      "{ max_retries = 5, backoff_s = 0.25 }")))
    assert built.retry_policy == RetryPolicy(max_retries=5, backoff_s=0.25)
    with pytest.raises(ConfigError, match=r"retry_policy.retries is not a known key; did you mean 'max_retries'"):
        load_pipeline(write(helpers, base.replace("batch_size = 4", "batch_size = 4\n        retry_policy = "
                                                  "{ retries = 5 }")))
    with pytest.raises(ConfigError, match=r"retry_policy.*max_retries"):
        load_pipeline(write(helpers, base.replace("batch_size = 4", "batch_size = 4\n        retry_policy = "
                                                  "{ max_retries = -1 }")))


def test_the_top_level_seed_reaches_the_host_stages(tmp_path):
    """Two runs with seeds 1 and 2 crop differently, a run repeats its own crops, and a stage given
    its own seed keeps it whatever the run's seed."""
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(4):
            pixels = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "images" / label / f"{i}.png")

    def crops(seed: int, stage_seed: str = "") -> np.ndarray:
        path = write(tmp_path, f"""
            batch_size = 8
            seed = {seed}
            [source.image_folder]
            root = "images"
            [[stages]]
            decode_image = {{ size = 8, crop = "random_resized"{stage_seed} }}
        """)
        return np.concatenate([np.asarray(b["image"]) for b in load_pipeline(path)])

    assert not np.array_equal(crops(1), crops(2))
    np.testing.assert_array_equal(crops(1), crops(1))
    np.testing.assert_array_equal(crops(1, ", seed = 7"), crops(2, ", seed = 7"))
