"""`[trainer.finetune]` / `FinetuneConfig`: pretrained weights, warm starts, probe, LoRA and
discriminative rates from a configuration file, against the same set-up written by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optax
import pytest
from flax import nnx

from datarax.cli.main import main
from datarax.config.schema import ConfigError, FieldError
from datarax.train import load_trainer
from datarax.train.pretrained import (
    FinetuneConfig,
    KeyMap,
    discriminative,
    export_table,
    load_safetensors,
    load_table,
    save_safetensors,
)

HELPERS = '''
import numpy as np
import jax.numpy as jnp
from flax import nnx
from datarax.train.pretrained import KeyMap

def make_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    return {"x": x, "y": (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1).astype(np.int32)}

class Net(nnx.Module):
    def __init__(self, classes=3, seed=0):
        self.body = nnx.Linear(4, 16, rngs=nnx.Rngs(seed))
        self.head = nnx.Linear(16, classes, rngs=nnx.Rngs(seed + 1))

    def __call__(self, x):
        return self.head(nnx.relu(self.body(x)))

def make_model(classes=3, seed=0):
    return Net(classes, seed)

class ConvNet(nnx.Module):
    """A convolutional body and a linear head: LoRA's default kinds ("linear") find the head only."""

    def __init__(self, classes=3, seed=0):
        self.body = nnx.Conv(1, 4, (3,), rngs=nnx.Rngs(seed))
        self.head = nnx.Linear(16, classes, rngs=nnx.Rngs(seed + 1))

    def __call__(self, x):
        return self.head(nnx.relu(self.body(x[..., None])).reshape(x.shape[0], -1))

def make_conv(classes=3, seed=0):
    return ConvNet(classes, seed)

def table(model):
    return [KeyMap("body.weight", "body.kernel", "linear"), KeyMap("body.bias", "body.bias"),
            KeyMap("head.weight", "head.kernel", "linear"), KeyMap("head.bias", "head.bias")]

def xent(model, batch):
    import optax
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()
'''

CONFIG = """allow = ["ft_helpers"]
batch_size = 16
[source.memory]
data = "ft_helpers:make_data"
shuffle = true
seed = 3
[trainer]
model = "ft_helpers:make_model"
model_args = {{ classes = {classes} }}
loss = "ft_helpers:xent"
optimizer = {{ adam = {{ learning_rate = 0.01 }} }}
steps = 6
compilation_cache = false
{extra}
[trainer.finetune]
{finetune}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "ft_helpers.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys
    sys.modules.pop("ft_helpers", None)
    importlib.invalidate_caches()
    return tmp_path


def helpers():
    import ft_helpers
    return ft_helpers


def pretrained_file(folder, seed=7, classes=3):
    """A checkpoint in PyTorch's layout of a `Net` with other weights; returns its tensors."""
    h = helpers()
    tensors = export_table(h.Net(classes, seed=seed), h.table(None))
    save_safetensors(tensors, folder / "pretrained.safetensors")
    return tensors


def job(folder, finetune, *, classes=5, extra="", name="run.toml"):
    path = folder / name
    path.write_text(CONFIG.format(classes=classes, extra=extra, finetune=finetune))
    return str(path)


def params(model):
    return {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_probe_from_a_safetensors_file_trains_only_the_new_head(folder):
    tensors = pretrained_file(folder)
    run = load_trainer(job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\n'
                                   'exclude = ["head."]\nmode = "probe"\nhead = ["head."]'))
    model = run.trainer.model
    np.testing.assert_array_equal(np.asarray(model.body.kernel.get_value()), tensors["body.weight"].T)
    head_before = np.asarray(model.head.kernel.get_value()).copy()
    np.testing.assert_array_equal(head_before, np.asarray(helpers().Net(5).head.kernel.get_value()))  # fresh head
    run.fit()
    run.trainer.close()
    np.testing.assert_array_equal(np.asarray(model.body.kernel.get_value()), tensors["body.weight"].T)
    np.testing.assert_array_equal(np.asarray(model.body.bias.get_value()), tensors["body.bias"])
    assert not np.array_equal(np.asarray(model.head.kernel.get_value()), head_before)


def test_lora_from_a_file_trains_adapters_and_head_only(folder):
    tensors = pretrained_file(folder)
    run = load_trainer(job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\n'
                                   'exclude = ["head."]\nmode = "lora"\nlora_rank = 2\nlora_where = ["body"]\n'
                                   'head = ["head."]'))
    model = run.trainer.model
    assert isinstance(model.body, nnx.LoRALinear) and isinstance(model.head, nnx.Linear)
    head_before = np.asarray(model.head.kernel.get_value()).copy()
    run.fit()
    run.trainer.close()
    np.testing.assert_array_equal(np.asarray(model.body.kernel.get_value()), tensors["body.weight"].T)
    assert np.abs(np.asarray(model.body.lora.lora_b.get_value())).max() > 0  # the adapters moved
    assert not np.array_equal(np.asarray(model.head.kernel.get_value()), head_before)


def test_full_with_a_backbone_factor_equals_the_hand_built_discriminative_run(folder):
    from datarax import Pipeline
    from datarax.sources import MemorySource, MemorySourceConfig
    from datarax.train import Trainer

    tensors = pretrained_file(folder, classes=3)
    run = load_trainer(job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\n'
                                   'mode = "full"\nhead = ["head."]\nbackbone_lr_factor = 0.1', classes=3))
    run.fit()
    run.trainer.close()
    # The reference: the same model, loaded by hand, with optax.multi_transform written out.
    h = helpers()
    model = h.Net(3)
    load_table(model, load_safetensors(folder / "pretrained.safetensors"), h.table(model))
    np.testing.assert_array_equal(np.asarray(model.body.kernel.get_value()), tensors["body.weight"].T)
    tx = discriminative(("head.", optax.adam(0.01)), default=optax.chain(optax.adam(0.01), optax.scale(0.1)))
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=h.make_data()), batch_size=16)
    reference = Trainer(model, tx, pipeline, h.xent, compilation_cache=False)
    reference.fit(6)
    reference.close()
    got, want = params(run.trainer.model), params(model)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=str(key))
    # ... and a factor really slows the backbone: plain adam moves it further from the file.
    plain = load_trainer(job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"',
                             classes=3, name="plain.toml"))
    plain.fit()
    plain.trainer.close()
    def moved(m):
        return np.abs(np.asarray(m.body.kernel.get_value()) - tensors["body.weight"].T).max()
    assert moved(run.trainer.model) < 0.5 * moved(plain.trainer.model)


def test_warm_start_from_a_checkpoint_with_a_new_head(folder):
    first = load_trainer(_without_finetune(job(folder, "", classes=3, extra='checkpoint_dir = "ckpt"',
                                               name="first.toml")))
    first.fit()
    first.trainer.close()
    run = load_trainer(job(folder, 'warm_start = "ckpt"\nexclude = ["head."]\nmode = "probe"\nhead = ["head."]'))
    body = np.asarray(first.trainer.model.body.kernel.get_value())
    np.testing.assert_array_equal(np.asarray(run.trainer.model.body.kernel.get_value()), body)
    assert run.trainer.model.head.kernel.get_value().shape == (16, 5)
    run.fit()
    run.trainer.close()
    np.testing.assert_array_equal(np.asarray(run.trainer.model.body.kernel.get_value()), body)  # frozen
    # strict (the default) refuses a head of another shape; strict = false restores what fits.
    with pytest.raises(ConfigError, match=r"trainer.finetune could not be applied: .*head.kernel"):
        load_trainer(job(folder, 'warm_start = "ckpt"', name="strict.toml"))
    loose = load_trainer(job(folder, 'warm_start = "ckpt"\nstrict = false', name="loose.toml"))
    np.testing.assert_array_equal(np.asarray(loose.trainer.model.body.kernel.get_value()), body)


def _without_finetune(path):
    from pathlib import Path

    text = Path(path).read_text().replace("[trainer.finetune]\n", "")
    Path(path).write_text(text)
    return path


@pytest.mark.parametrize("finetune, key, words", [
    ('mode = "frozen"', "mode", "must be one of ('full', 'probe', 'lora')"),
    ('mode = "probe"', "head", 'is needed with mode = "probe"'),
    ('mode = "lora"', "lora_rank", "is needed"),
    ('mode = "lora"\nlora_rank = 0', "lora_rank", "must be an integer >= 1"),
    ('lora_rank = 4', "lora_rank", 'applies to mode = "lora" only'),
    ('mode = "lora"\nlora_rank = 2\nlora_kinds = ["dense"]', "lora_kinds", "must name layer kinds among ('linear', "
                                                                           "'conv')"),
    ('lora_kinds = ["conv"]', "lora_kinds", 'applies to mode = "lora" only'),
    ('backbone_lr_factor = 0.1', "head", "is needed with backbone_lr_factor"),
    ('mode = "probe"\nhead = ["head."]\nbackbone_lr_factor = 0.1', "backbone_lr_factor", 'applies to mode = "full"'),
    ('backbone_lr_factor = -1\nhead = ["head."]', "backbone_lr_factor", "must be a number > 0"),
    ('weights = "w.bin"\nlayout = "resnet"', "weights", "must be a file ending in"),
    ('weights = "pretrained.safetensors"', "layout", "is needed with weights"),
    ('weights = "pretrained.safetensors"\nlayout = "vgg"', "layout", "must be one of ('crepe', 'resnet', 'bert')"),
    ('layout = "resnet"', "layout", "applies to weights only"),
    ('weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\nwarm_start = "ckpt"', "warm_start", "not both"),
    ('step = 3', "step", "applies to warm_start only"),
    ('exclude = ["head."]', "exclude", "add one of them"),
    ('mode = "lora"\nlora_rank = 2\nlora_where = 3', "lora_where", "must be"),
    ('mode = "probe"\nhead = "head."', "head", "must be"),
    # What only the model and the files can tell: checked by validate without training.
    ('weights = "missing.safetensors"\nlayout = "ft_helpers:table"', "weights", "do not exist"),
    ('weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"', "weights",
     "'head.weight' (5, 16) -> 'head.kernel' gives (16, 5) (linear), the module has (16, 3)"),
    ('weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"', "weights", 'exclude = ["fc."]'),
    ('weights = "pretrained.safetensors"\nlayout = "bert"', "layout", "is the table of "
                                                                      "datarax.train.pretrained.BertEncoder"),
    ('mode = "probe"\nhead = ["fc."]', "head", "selects no parameter of Net; its parameters start with"),
    ('warm_start = "nowhere"', "warm_start", "holds no checkpoint step"),
])
def test_validate_rejects_each_bad_value_at_its_key(folder, capsys, finetune, key, words):
    pretrained_file(folder, classes=5)  # a checkpoint of a 5-class Net; the job's model has 3 classes
    path = job(folder, finetune, classes=3)
    assert main(["validate", path]) == 1
    err = capsys.readouterr().err
    assert f"trainer.finetune.{key}" in err and words in err, err


def test_validate_accepts_a_good_table_and_reads_nothing_into_the_model(folder, capsys):
    pretrained_file(folder, classes=5)
    path = job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\nmode = "lora"\n'
                       'lora_rank = 2\nhead = ["head."]', classes=5)
    assert main(["validate", path]) == 0, capsys.readouterr().err


def test_an_import_path_layout_must_be_allowed(folder, capsys):
    path = job(folder, 'weights = "pretrained.safetensors"\nlayout = "os:system"')
    assert main(["validate", path]) == 1
    err = capsys.readouterr().err
    assert "trainer.finetune.layout" in err and "os" in err


def test_python_field_errors_name_the_field():
    with pytest.raises(FieldError, match="must be one of") as info:
        FinetuneConfig(mode="partial")
    assert info.value.field == "mode"
    assert FinetuneConfig(head=["fc."], mode="probe").head == ("fc.",)  # lists become tuples


def test_load_table_include_exclude_leave_the_rest_alone():
    h_table = [KeyMap("a.weight", "a.kernel", "linear"), KeyMap("b.weight", "b.kernel", "linear")]

    class Two(nnx.Module):
        def __init__(self, seed):
            self.a = nnx.Linear(2, 3, use_bias=False, rngs=nnx.Rngs(seed))
            self.b = nnx.Linear(3, 2, use_bias=False, rngs=nnx.Rngs(seed + 1))

    tensors = export_table(Two(9), h_table)
    for kwargs, loaded in (({"exclude": ("b.",)}, "a"), ({"include": ("b.",)}, "b")):
        model = Two(0)
        before = {n: np.asarray(getattr(model, n).kernel.get_value()).copy() for n in "ab"}
        load_table(model, tensors, h_table, **kwargs)
        for name in "ab":
            value = np.asarray(getattr(model, name).kernel.get_value())
            if name == loaded:
                np.testing.assert_array_equal(value, tensors[f"{name}.weight"].T)
            else:
                np.testing.assert_array_equal(value, before[name])
    model = Two(0)
    before = np.asarray(model.a.kernel.get_value()).copy()
    load_table(model, tensors, h_table, check_only=True)
    np.testing.assert_array_equal(np.asarray(model.a.kernel.get_value()), before)


def test_train_prints_and_writes_what_the_fine_tune_loaded_adapted_and_trains(folder, capsys):
    """Counts from the layer shapes, by hand: body 4x16 + 16 frozen; head 16x5 + 5 trained; rank-2
    adapters on body (2 x (4 + 16)) and head (2 x (16 + 5)) trained."""
    import json

    pretrained_file(folder)
    path = job(folder, 'weights = "pretrained.safetensors"\nlayout = "ft_helpers:table"\nexclude = ["head."]\n'
                       'mode = "lora"\nlora_rank = 2\nhead = ["head."]')
    assert main(["train", path, "--no-progress"]) == 0
    out, err = capsys.readouterr()
    trained, frozen = (16 * 5 + 5) + 2 * (4 + 16) + 2 * (16 + 5), 4 * 16 + 16
    summary = (f"mode lora; 2 keys loaded from {folder / 'pretrained.safetensors'}, 2 skipped (head.bias, "
               f"head.kernel); LoRA adapters on 2 layer(s): body, head; {trained:,} parameters train, "
               f"{frozen:,} frozen")
    assert f"finetune     {summary}" in out and f"datarax: finetune: {summary}" in err
    report = json.loads((folder / "runs" / "run" / "result.json").read_text())["finetune"]
    assert report["loaded"] == ["body.bias", "body.kernel"] and report["skipped"] == ["head.bias", "head.kernel"]
    assert report["lora"] == ["body", "head"] and (report["trained"], report["frozen"]) == (trained, frozen)
    assert "probe in disguise" not in err


def test_adapters_only_on_the_new_head_are_named_a_probe_in_disguise(folder, capsys):
    """The default lora_kinds on a convolutional body adapt the head alone: validate and train say so."""
    import json

    text = Path(job(folder, 'mode = "lora"\nlora_rank = 2\nhead = ["head."]', classes=3)).read_text()
    Path(folder / "run.toml").write_text(text.replace('model = "ft_helpers:make_model"',
                                                      'model = "ft_helpers:make_conv"'))
    path = str(folder / "run.toml")
    assert main(["validate", path]) == 0
    assert ("every LoRA adapter sits in the new head (head): the pretrained backbone trains nothing, so this is a "
            "probe in disguise. Put adapters on the backbone: lora_kinds = [\"linear\", \"conv\"]"
            in capsys.readouterr().err)
    assert main(["train", path, "--no-progress"]) == 0
    assert "probe in disguise" in capsys.readouterr().err
    report = json.loads((folder / "runs" / "run" / "result.json").read_text())["finetune"]
    assert report["lora"] == ["head"] and report["frozen"] == 4 * 3 + 4  # the conv body: frozen whole
