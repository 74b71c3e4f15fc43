"""A BERT encoder in Flax NNX with the key table of Hugging Face `BertModel` checkpoints.

The layout is `transformers`' (`embeddings.word_embeddings.weight`,
`encoder.layer.{i}.attention.self.query.weight`, `...attention.output.LayerNorm.bias`,
`...intermediate.dense`, `...output.dense`, `pooler.dense`), with a `prefix` for task models
(`bert.` in `BertForSequenceClassification`). The sizes come from the checkpoint's `config.json`
through `BertConfig.from_hf`:

    config = BertConfig.from_hf(json.load(open("config.json")))
    model = BertEncoder(config)
    load_table(model, load_safetensors("model.safetensors"), bert_table(model))
    hidden, pooled = model(input_ids, attention_mask=mask)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.train.pretrained.tables import KeyMap

ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False), "gelu_new": jax.nn.gelu, "relu": jax.nn.relu}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT encoder, named as in Hugging Face's `config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"BertConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"BertConfig.hidden_act must be one of {tuple(ACTIVATIONS)}, got {self.hidden_act!r}")

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> BertConfig:
        """The fields of a Hugging Face `config.json` (as a dict) that this encoder uses; the rest are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in names})


class BertLayer(nnx.Module):
    """Self-attention and a feed-forward block, each with a residual and a post-LayerNorm."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        d, eps = config.hidden_size, config.layer_norm_eps
        self.heads = config.num_attention_heads
        self.act = config.hidden_act
        self.query, self.key, self.value = (nnx.Linear(d, d, rngs=rngs) for _ in range(3))
        self.attention_out = nnx.Linear(d, d, rngs=rngs)
        self.attention_norm = nnx.LayerNorm(d, epsilon=eps, rngs=rngs)
        self.intermediate = nnx.Linear(d, config.intermediate_size, rngs=rngs)
        self.output = nnx.Linear(config.intermediate_size, d, rngs=rngs)
        self.output_norm = nnx.LayerNorm(d, epsilon=eps, rngs=rngs)

    def __call__(self, x: jax.Array, bias: jax.Array) -> jax.Array:
        b, n, d = x.shape
        def split(t):
            return t.reshape(b, n, self.heads, d // self.heads).transpose(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // self.heads) + bias
        context = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
        x = self.attention_norm(x + self.attention_out(context))
        return self.output_norm(x + self.output(ACTIVATIONS[self.act](self.intermediate(x))))


class BertEncoder(nnx.Module):
    """`BertModel`: token, position and segment embeddings, the layers, and the tanh pooler."""

    def __init__(self, config: BertConfig | None = None, *, rngs: nnx.Rngs | None = None):
        config = config if config is not None else BertConfig()
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        d = config.hidden_size
        self.config = config
        self.word_embeddings = nnx.Embed(config.vocab_size, d, rngs=rngs)
        self.position_embeddings = nnx.Embed(config.max_position_embeddings, d, rngs=rngs)
        self.token_type_embeddings = nnx.Embed(config.type_vocab_size, d, rngs=rngs)
        self.embedding_norm = nnx.LayerNorm(d, epsilon=config.layer_norm_eps, rngs=rngs)
        self.layers = nnx.List([BertLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
        self.pooler = nnx.Linear(d, d, rngs=rngs)

    def __call__(self, input_ids: jax.Array, *, token_type_ids: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """(hidden states `(b, n, d)`, pooled `(b, d)`); `attention_mask` is 1 for real tokens, 0 for padding."""
        n = input_ids.shape[1]
        types = jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(jnp.arange(n))[None] \
            + self.token_type_embeddings(types)
        x = self.embedding_norm(x)
        mask = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
        bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, bias)
        return x, jnp.tanh(self.pooler(x[:, 0]))


def _linear(key: str, path: str) -> list[KeyMap]:
    return [KeyMap(f"{key}.weight", f"{path}.kernel", "linear"), KeyMap(f"{key}.bias", f"{path}.bias")]


def _norm(key: str, path: str) -> list[KeyMap]:
    return [KeyMap(f"{key}.weight", f"{path}.scale"), KeyMap(f"{key}.bias", f"{path}.bias")]


def bert_table(model: BertEncoder, prefix: str = "") -> tuple[KeyMap, ...]:
    """Every key of a Hugging Face `BertModel` state dict for `model`'s depth (`prefix`: e.g. "bert.")."""
    table = [KeyMap("embeddings.word_embeddings.weight", "word_embeddings.embedding"),
             KeyMap("embeddings.position_embeddings.weight", "position_embeddings.embedding"),
             KeyMap("embeddings.token_type_embeddings.weight", "token_type_embeddings.embedding"),
             *_norm("embeddings.LayerNorm", "embedding_norm")]
    for i in range(len(model.layers)):
        key, path = f"encoder.layer.{i}", f"layers.{i}"
        for name in ("query", "key", "value"):
            table += _linear(f"{key}.attention.self.{name}", f"{path}.{name}")
        table += [*_linear(f"{key}.attention.output.dense", f"{path}.attention_out"),
                  *_norm(f"{key}.attention.output.LayerNorm", f"{path}.attention_norm"),
                  *_linear(f"{key}.intermediate.dense", f"{path}.intermediate"),
                  *_linear(f"{key}.output.dense", f"{path}.output"),
                  *_norm(f"{key}.output.LayerNorm", f"{path}.output_norm")]
    table += _linear("pooler.dense", "pooler")
    return tuple(KeyMap(prefix + m.key, m.path, m.transform) for m in table)
