"""LoRA, linear probe, discriminative rates and warm start, trained through the Trainer."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import loss_fn, make_setup

from datarax.train import Trainer
from datarax.train.callbacks import CheckpointCallback
from datarax.train.pretrained import (
    KeyMap,
    LoRAConv,
    WarmStartError,
    add_lora,
    discriminative,
    export_table,
    load_safetensors,
    load_table,
    lora_optimizer,
    merge_lora,
    probe_optimizer,
    save_safetensors,
    warm_start,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "trainers.md"


class Net(nnx.Module):
    def __init__(self, classes: int = 3, seed: int = 0):
        rngs = nnx.Rngs(seed)
        self.backbone = nnx.List([nnx.Linear(4, 16, rngs=rngs), nnx.Linear(16, 16, rngs=rngs)])
        self.head = nnx.Linear(16, classes, rngs=rngs)

    def __call__(self, x):
        for layer in self.backbone:
            x = jax.nn.relu(layer(x))
        return self.head(x)


TABLE = tuple(KeyMap(f"{key}.{w}", f"{path}.{n}", t) for key, path in
              (("backbone.0", "backbone.0"), ("backbone.1", "backbone.1"), ("classifier", "head"))
              for w, n, t in (("weight", "kernel", "linear"), ("bias", "bias", "copy")))


def params(model, kind=nnx.Param) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.iter_graph(model)
            if isinstance(v, kind)}


def fit(model, optimizer, steps: int = 6):
    setup = make_setup()
    trainer = Trainer(model, optimizer, setup.pipeline, loss_fn, compilation_cache=False)
    trainer.fit(num_steps=steps)
    trainer.close()


def test_lora_trains_only_the_adapters_and_merges_to_the_same_function(tmp_path):
    model = Net()
    replaced = add_lora(model, rank=2, where=lambda path: path.startswith("backbone."), rngs=nnx.Rngs(5))
    assert replaced == ["backbone.0", "backbone.1"]
    base = {k: v for k, v in params(model).items() if "lora" not in k}
    adapters = params(model, nnx.LoRAParam)
    assert len(adapters) == 4 and all(not v.any() for k, v in adapters.items() if k.endswith("lora_b"))
    fit(model, lora_optimizer(model, optax.adam(5e-2)))
    after = params(model)
    assert all(np.array_equal(after[k], v) for k, v in base.items())  # bitwise: no update reached them
    assert any(not np.array_equal(v, adapters[k]) for k, v in params(model, nnx.LoRAParam).items())

    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    before_merge = np.asarray(model(x))
    assert merge_lora(model) == ["backbone.0", "backbone.1"]
    assert not params(model, nnx.LoRAParam)
    np.testing.assert_allclose(np.asarray(model(x)), before_merge, atol=1e-5)

    save_safetensors(export_table(model, TABLE), tmp_path / "merged.safetensors")
    fresh = Net(seed=9)
    load_table(fresh, load_safetensors(tmp_path / "merged.safetensors"), TABLE)
    assert all(np.array_equal(params(fresh)[k], v) for k, v in params(model).items())
    np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(model(x)))


def test_lora_errors_name_the_fix():
    with pytest.raises(ValueError, match="no nnx.Linear"):
        add_lora(Net(), rank=2, where=lambda path: path.startswith("encoder."))
    with pytest.raises(ValueError, match="add_lora"):
        lora_optimizer(Net(), optax.adam(1e-3))


def conv_reference(x, kernel, bias, stride, padding):
    """A 1-d convolution by hand: y[b, t, o] = sum_{k, c} xp[b, t * stride + k, c] * kernel[k, c, o] + bias[o]."""
    xp = np.pad(x, ((0, 0), padding, (0, 0)))
    taps = kernel.shape[0]
    count = (xp.shape[1] - taps) // stride + 1
    y = np.zeros((x.shape[0], count, kernel.shape[2]))
    for t in range(count):
        window = xp[:, t * stride:t * stride + taps, :]  # (b, k, c)
        y[:, t, :] = np.einsum("bkc,kco->bo", window, kernel) + bias
    return y


@pytest.mark.parametrize("stride,padding,rank", [(1, "VALID", 1), (2, "SAME", 3), (3, ((2, 1),), 2)])
def test_lora_conv_is_a_convolution_with_the_low_rank_merged_kernel(stride, padding, rank):
    """LoRAConv's output = the hand-computed convolution with kernel + (lora_a @ lora_b) reshaped to (k, in, out)."""
    layer = LoRAConv(3, 5, (4,), stride, lora_rank=rank, padding=padding, rngs=nnx.Rngs(2))
    assert layer.lora.lora_a.shape == (4 * 3, rank) and layer.lora.lora_b.shape == (rank, 5)
    assert isinstance(layer.lora.lora_b, nnx.LoRAParam) and not layer.lora.lora_b.get_value().any()
    rng = np.random.default_rng(stride)
    a, b = rng.normal(size=(12, rank)), rng.normal(size=(rank, 5))
    layer.lora.lora_a.set_value(jnp.asarray(a, jnp.float32))
    layer.lora.lora_b.set_value(jnp.asarray(b, jnp.float32))
    x = rng.normal(size=(2, 11, 3)).astype(np.float32)
    kernel = np.asarray(layer.kernel.get_value(), np.float64)
    merged = kernel + (a @ b).reshape(4, 3, 5)  # row k * in + c of the (k * in, out) matrix is kernel[k, c]
    pads = {"VALID": (0, 0), "SAME": None}[padding] if isinstance(padding, str) else padding[0]
    if pads is None:  # lax SAME: total padding so that ceil(n / stride) outputs, the extra sample after
        total = max((-(-11 // stride) - 1) * stride + 4 - 11, 0)
        pads = (total // 2, total - total // 2)
    expected = conv_reference(x.astype(np.float64), merged, np.asarray(layer.bias.get_value()), stride, pads)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-4, atol=1e-4)
    # and with lora_b = 0 the layer is the plain convolution it was built from
    layer.lora.lora_b.set_value(jnp.zeros((rank, 5)))
    expected = conv_reference(x.astype(np.float64), kernel, np.asarray(layer.bias.get_value()), stride, pads)
    np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-4, atol=1e-4)


class ConvNet(nnx.Module):
    def __init__(self, classes: int = 3, seed: int = 0):
        rngs = nnx.Rngs(seed)
        self.convs = nnx.List([nnx.Conv(1, 6, (3,), padding="SAME", rngs=rngs),
                               nnx.Conv(6, 4, (2,), strides=2, padding="VALID", rngs=rngs)])
        self.head = nnx.Linear(8, classes, rngs=rngs)

    def __call__(self, x):
        x = x[:, :, None]
        for conv in self.convs:
            x = jax.nn.relu(conv(x))
        return self.head(x.reshape(x.shape[0], -1))


CONV_TABLE = tuple(KeyMap(f"{key}.{w}", f"{key}.{n}", t) for key, kind in
                   (("convs.0", "conv"), ("convs.1", "conv"), ("head", "linear"))
                   for w, n, t in (("weight", "kernel", kind), ("bias", "bias", "copy")))


def test_conv_lora_trains_adapters_and_head_only_and_merges_to_the_same_function(tmp_path):
    model = ConvNet()
    assert add_lora(model, rank=2, kinds=("conv",), rngs=nnx.Rngs(3)) == ["convs.0", "convs.1"]
    assert all(type(c) is LoRAConv for c in model.convs) and type(model.head) is nnx.Linear
    base = {k: v for k, v in params(model).items() if "lora" not in k and k.startswith("convs.")}
    head = {k: v for k, v in params(model).items() if k.startswith("head.")}
    adapters = params(model, nnx.LoRAParam)
    assert sorted(adapters) == [f"convs.{i}.lora.lora_{ab}" for i in (0, 1) for ab in "ab"]
    assert adapters["convs.0.lora.lora_a"].shape == (3 * 1, 2) and adapters["convs.1.lora.lora_a"].shape == (2 * 6, 2)
    fit(model, lora_optimizer(model, optax.adam(5e-2), head=("head.",)))
    after = params(model)
    assert all(np.array_equal(after[k], v) for k, v in base.items())  # bitwise: the backbone did not move
    assert all(not np.array_equal(after[k], v) for k, v in head.items())  # the head trained with the adapters
    assert all(not np.array_equal(v, adapters[k]) for k, v in params(model, nnx.LoRAParam).items()
               if k.endswith("lora_b"))

    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    before_merge = np.asarray(model(x))
    kernel = model.convs[1].kernel.get_value() + (model.convs[1].lora.lora_a.get_value()
                                                  @ model.convs[1].lora.lora_b.get_value()).reshape(2, 6, 4)
    assert merge_lora(model) == ["convs.0", "convs.1"]
    assert all(type(c) is nnx.Conv for c in model.convs) and not params(model, nnx.LoRAParam)
    assert model.convs[1].strides == 2 and model.convs[0].padding == "SAME"
    np.testing.assert_allclose(np.asarray(model.convs[1].kernel.get_value()), np.asarray(kernel), atol=1e-6)
    np.testing.assert_allclose(np.asarray(model(x)), before_merge, atol=1e-5)

    save_safetensors(export_table(model, CONV_TABLE), tmp_path / "merged.safetensors")
    fresh = ConvNet(seed=9)
    load_table(fresh, load_safetensors(tmp_path / "merged.safetensors"), CONV_TABLE)
    np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(model(x)))


def test_conv_lora_errors_name_the_fix():
    with pytest.raises(ValueError, match="kinds must name layers among"):
        add_lora(ConvNet(), rank=2, kinds=("attention",))
    with pytest.raises(ValueError, match=r"no nnx.Conv in ConvNet matched where=.*convs.0"):
        add_lora(ConvNet(), rank=2, kinds="conv", where=lambda path: path.startswith("encoder."))
    model = ConvNet()
    assert add_lora(model, rank=1, kinds=("linear", "conv")) == ["convs.0", "convs.1", "head"]
    with pytest.raises(ValueError, match="head=\\('fc.',\\) selects no nnx.Param"):
        lora_optimizer(model, optax.adam(1e-3), head=("fc.",))


def test_a_linear_probe_leaves_the_backbone_bitwise_unchanged():
    model = Net()
    before = params(model)
    fit(model, probe_optimizer(model, optax.adam(5e-2), head=("head.",)))
    after = params(model)
    assert all(np.array_equal(after[k], v) for k, v in before.items() if k.startswith("backbone."))
    assert not np.array_equal(after["head.kernel"], before["head.kernel"])
    with pytest.raises(ValueError, match="selects no nnx.Param"):
        probe_optimizer(model, optax.adam(1e-3), head=("fc.",))


def test_discriminative_rates_follow_the_paths():
    """Plain SGD per part: each parameter moves by -rate * its gradient, computed here by hand."""
    model = Net()
    x = jnp.asarray(np.random.default_rng(1).normal(size=(8, 4)), jnp.float32)
    y = jnp.arange(8) % 3
    rates = {"backbone.0.": 0.0, "backbone.": 0.1, "head.": 1.0}
    tx = discriminative(*[(p, optax.sgd(r)) for p, r in rates.items()], default=optax.sgd(123.0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(model)
    before = params(model)
    optimizer.update(model, grads)
    flat_grads = {".".join(map(str, p)): np.asarray(v) for p, v in nnx.to_flat_state(grads)}
    for key, value in params(model).items():
        rate = next(r for p, r in rates.items() if key.startswith(p))
        np.testing.assert_allclose(value, before[key] - rate * flat_grads[key], atol=1e-6, err_msg=key)
    with pytest.raises(TypeError, match="path prefix, optax transformation"):
        discriminative(("head.", 0.1), default=optax.sgd(1.0))


def test_warm_start_into_a_model_with_a_new_head(tmp_path):
    setup = make_setup()
    old = Net()
    trainer = Trainer(old, optax.adam(5e-2), setup.pipeline, loss_fn, compilation_cache=False,
                      callbacks=[CheckpointCallback(tmp_path / "ckpt", every_steps=3, asynchronous=False)])
    trainer.fit(num_steps=3)
    trainer.close()
    trained = params(old)

    new = Net(classes=5, seed=7)
    head = params(new)
    with pytest.raises(WarmStartError, match=r"head\.kernel: saved \(16, 3\)"):
        warm_start(new, tmp_path / "ckpt")
    assert all(np.array_equal(params(new)[k], v) for k, v in head.items())  # strict: nothing written

    report = warm_start(new, tmp_path / "ckpt", strict=False)
    assert report.step == 3 and report.missing == () and report.unexpected == ()
    assert [m.split(":")[0] for m in report.mismatched] == ["head.bias", "head.kernel"]
    assert set(report.restored) == {k for k in trained if k.startswith("backbone.")}
    for key, value in params(new).items():
        np.testing.assert_array_equal(value, trained[key] if key.startswith("backbone.") else head[key])

    subset = Net(classes=3, seed=8)
    report = warm_start(subset, tmp_path / "ckpt", include=("backbone.0.",))
    assert report.restored == ("backbone.0.bias", "backbone.0.kernel")
    assert np.array_equal(params(subset)["backbone.0.kernel"], trained["backbone.0.kernel"])
    assert not np.array_equal(params(subset)["backbone.1.kernel"], trained["backbone.1.kernel"])

    class Other(Net):
        def __init__(self):
            super().__init__()
            self.extra = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    with pytest.raises(WarmStartError, match=r"missing from the checkpoint: \['extra.bias', 'extra.kernel'\]"):
        warm_start(Other(), tmp_path / "ckpt")

