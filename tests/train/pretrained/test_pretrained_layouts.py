"""Public checkpoint layouts (torchvision/timm ResNet, HF BERT) through their key tables, and safetensors io.

Random checkpoints in the real key layouts: every key mapped, every shape matched, the
safetensors round trip exact, and (where torch is installed) the NNX forward pass equal to
torch's: torchvision's ResNet (the layout timm's resnet18/50 share) and a BERT forward written
with torch.nn.functional on the HF `BertModel` state dict.
"""

from __future__ import annotations

import json
import math
import struct

import jax
import numpy as np
import pytest
from flax import nnx

from datarax.train.pretrained import (
    BertConfig,
    BertEncoder,
    LayoutError,
    ResNet,
    bert_table,
    export_table,
    load_safetensors,
    load_table,
    preprocessing_stages,
    resnet_table,
    save_safetensors,
)

TINY_BERT = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=24, max_position_embeddings=12)
RESNETS = [("basic", "BasicBlock"), ("bottleneck", "Bottleneck")]


def random_checkpoint(table, model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays under the table's checkpoint keys, in the checkpoint's (PyTorch) shapes."""
    rng = np.random.default_rng(seed)
    shapes = {k: v.shape for k, v in export_table(model, table).items()}
    out = {}
    for key, shape in shapes.items():
        array = rng.normal(size=shape).astype(np.float32) * 0.2
        if key.endswith("running_var"):
            array = rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
        out[key] = array
    return out


def zeros(make):
    """The model `make()` builds, with zeros in every variable instead of its random initialisation
    (the round trip below loads a random checkpoint into every variable; each initialiser compiles on
    first use, seconds for the two ResNets)."""
    graphdef, state = nnx.split(nnx.eval_shape(make))
    return nnx.merge(graphdef, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), state))


# Built by the test that uses them, not at collection (where every xdist worker built all three).
MODELS = {"resnet-basic": (lambda: ResNet("basic", (1, 1, 1, 1), num_classes=10, width=8), resnet_table),
          "resnet-bottleneck": (lambda: ResNet("bottleneck", (1, 1, 1, 1), num_classes=10, width=8), resnet_table),
          "bert": (lambda: BertEncoder(TINY_BERT), bert_table)}


@pytest.mark.parametrize("name", list(MODELS))
def test_random_checkpoint_round_trips_exactly_through_safetensors(tmp_path, name):
    make_model, make_table = MODELS[name]
    model = zeros(make_model)
    table = make_table(model)
    assert len({m.key for m in table}) == len({m.path for m in table}) == len(table)
    checkpoint = random_checkpoint(table, model)
    save_safetensors(checkpoint, tmp_path / "w.safetensors", metadata={"format": "pt"})
    st = pytest.importorskip("safetensors.numpy")
    reference = st.load_file(tmp_path / "w.safetensors")
    tensors, metadata = load_safetensors(tmp_path / "w.safetensors", with_metadata=True)
    assert metadata == {"format": "pt"} and set(tensors) == set(reference) == set(checkpoint)
    load_table(model, tensors, table)
    exported = export_table(model, table)
    save_safetensors(exported, tmp_path / "back.safetensors")
    back = load_safetensors(tmp_path / "back.safetensors")
    for key, array in checkpoint.items():
        np.testing.assert_array_equal(reference[key], array)
        np.testing.assert_array_equal(back[key], array)
        assert back[key].dtype == array.dtype


def test_a_checkpoint_that_does_not_fit_lists_every_problem_and_changes_nothing():
    model = zeros(MODELS["resnet-basic"][0])  # a partial load would show: the checkpoint's values are not zeros
    table = resnet_table(model)
    checkpoint = random_checkpoint(table, model)
    before = export_table(model, table)
    checkpoint.pop("fc.bias")
    checkpoint["fc.weight"] = np.zeros((5, 64), np.float32)
    checkpoint["head.extra"] = np.zeros(3, np.float32)
    with pytest.raises(LayoutError) as info:
        load_table(model, checkpoint, table, source="bad.safetensors")
    message = str(info.value)
    assert "bad.safetensors" in message and "'head.extra' is not in the table" in message
    assert "'fc.bias' (for 'fc.bias') is missing" in message and "'fc.weight' (5, 64)" in message
    after = export_table(model, table)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_ignored_keys_and_prefixes(tmp_path):
    model = zeros(MODELS["bert"][0])
    table = bert_table(model, prefix="bert.")
    checkpoint = random_checkpoint(table, model)
    checkpoint["bert.embeddings.position_ids"] = np.arange(12)[None]
    with pytest.raises(LayoutError, match="position_ids"):
        load_table(model, checkpoint, table)
    load_table(model, checkpoint, table, ignore=("*.position_ids",))


def test_bfloat16_round_trips(tmp_path):
    import ml_dtypes

    array = np.linspace(-3, 3, 10, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 5)
    save_safetensors({"w": array, "b": np.ones(2, np.float32)}, tmp_path / "bf.safetensors")
    back = load_safetensors(tmp_path / "bf.safetensors")
    assert back["w"].dtype == array.dtype
    np.testing.assert_array_equal(back["w"].view(np.uint16), array.view(np.uint16))
    torch = pytest.importorskip("torch", reason="torch is not installed")
    st_torch = pytest.importorskip("safetensors.torch")
    loaded = st_torch.load_file(tmp_path / "bf.safetensors")
    assert loaded["w"].dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded["w"].float().numpy(), array.astype(np.float32))


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ValueError, match="does not fit the file"):
        load_safetensors(path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(ValueError, match="'w'"):
        load_safetensors(path)


@pytest.mark.parametrize("block,torch_block", RESNETS)
def test_resnet_matches_torchvision(block, torch_block):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    torch.manual_seed(0)
    reference = torchvision.models.resnet.ResNet(getattr(torchvision.models.resnet, torch_block), [1, 1, 1, 1],
                                                 num_classes=10)
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.BatchNorm2d):  # statistics other than the initial 0/1
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.normal_(1, 0.1)
                module.bias.normal_(0, 0.1)
    reference.eval()
    state = {k: v.numpy() for k, v in reference.state_dict().items()}
    # Shapes only: the table fills every variable (and random-initialising 11M weights is slow).
    model = nnx.eval_shape(lambda: ResNet(block, (1, 1, 1, 1), num_classes=10))
    load_table(model, state, resnet_table(model), ignore=("*.num_batches_tracked",))
    model.eval()
    images = np.random.default_rng(1).normal(size=(2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        expected = reference(torch.tensor(images)).numpy()
    np.testing.assert_allclose(np.asarray(model(images.transpose(0, 2, 3, 1))), expected, atol=2e-5)
    exported = export_table(model, resnet_table(model))
    assert set(exported) == {k for k in state if not k.endswith("num_batches_tracked")}
    assert all(np.array_equal(exported[k], state[k]) for k in exported)


def torch_bert(state, input_ids, token_type_ids, mask, config: BertConfig):
    """`BertModel.forward` (eval mode, absolute positions) in torch.nn.functional on its state dict."""
    import torch
    import torch.nn.functional as F

    w = {k: torch.tensor(v) for k, v in state.items()}
    d, heads = config.hidden_size, config.num_attention_heads
    eps = config.layer_norm_eps
    n = input_ids.shape[1]
    x = (F.embedding(input_ids, w["embeddings.word_embeddings.weight"])
         + F.embedding(torch.arange(n), w["embeddings.position_embeddings.weight"])[None]
         + F.embedding(token_type_ids, w["embeddings.token_type_embeddings.weight"]))
    x = F.layer_norm(x, (d,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        def lin(t, name):
            return F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])
        def split(t):
            return t.view(t.shape[0], n, heads, d // heads).transpose(1, 2)
        q, k, v = (split(lin(x, f"attention.self.{s}")) for s in ("query", "key", "value"))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads) + bias, dim=-1)
        context = (attention @ v).transpose(1, 2).reshape(x.shape)
        x = F.layer_norm(x + lin(context, "attention.output.dense"), (d,), w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], eps)
        hidden = lin(F.gelu(lin(x, "intermediate.dense")), "output.dense")
        x = F.layer_norm(x + hidden, (d,), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    pooled = torch.tanh(F.linear(x[:, 0], w["pooler.dense.weight"], w["pooler.dense.bias"]))
    return x.numpy(), pooled.numpy()


def test_bert_matches_a_torch_forward_pass():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    model = BertEncoder(TINY_BERT)
    table = bert_table(model)
    state = random_checkpoint(table, model, seed=3)
    load_table(model, state, table)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 50, size=(3, 7))
    types = rng.integers(0, 2, size=(3, 7))
    mask = np.ones((3, 7), np.int64)
    mask[1, 4:] = 0
    expected_hidden, expected_pooled = torch_bert(state, torch.tensor(ids), torch.tensor(types), torch.tensor(mask),
                                                  TINY_BERT)
    hidden, pooled = model(ids, token_type_ids=types, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(hidden), expected_hidden, atol=2e-5)
    np.testing.assert_allclose(np.asarray(pooled), expected_pooled, atol=2e-5)


def test_bert_config_from_hf_config_json():
    hf = {"architectures": ["BertModel"], "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1,
          "intermediate_size": 24, "vocab_size": 50, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
          "max_position_embeddings": 12, "type_vocab_size": 2, "model_type": "bert"}
    config = BertConfig.from_hf(hf)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (16, 1, 50)
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        BertConfig(hidden_size=10, num_attention_heads=3)


# Hugging Face preprocessor_config.json files as the ViT and CLIP image processors write them.
VIT = {"do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
       "size": {"height": 224, "width": 224}, "rescale_factor": 1 / 255}
CLIP = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "size": {"shortest_edge": 224}}


@pytest.mark.parametrize("config,resize", [(VIT, "fixed"), (CLIP, "shorter_side")])
def test_image_stages_carry_the_checkpoint_values(config, resize):
    decode, to_float, normalize = preprocessing_stages(config)
    assert decode.config.size == (224, 224) and decode.config.resize == resize
    assert to_float.config.field == "image"
    assert normalize.config.mean == tuple(config["image_mean"]) and normalize.config.std == tuple(config["image_std"])


def test_a_config_without_preprocessing_is_refused():
    with pytest.raises(ValueError, match="neither image_mean/image_std nor sampling_rate"):
        preprocessing_stages({"hidden_size": 16})
