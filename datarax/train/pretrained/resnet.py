"""ResNet in Flax NNX with the key table of timm's and torchvision's checkpoints.

timm's and torchvision's `resnet18`/`resnet50` share one state-dict layout: `conv1`, `bn1`,
`layer{1..4}.{block}.conv{1,2[,3]}` / `bn{...}`, `layer{n}.0.downsample.0` (1x1 conv) and
`.downsample.1` (its batch norm), and `fc`. `resnet_table(model)` lists every key for the model's
depth:

    model = ResNet("basic", (2, 2, 2, 2), num_classes=1000)        # resnet18
    load_table(model, load_safetensors("resnet18.safetensors"), resnet_table(model),
               ignore=("*.num_batches_tracked",))
    logits = model.eval()(images_nhwc)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.train.pretrained.tables import KeyMap

BLOCKS = {"basic": 1, "bottleneck": 4}  # each block kind's channel expansion


def _conv(n_in: int, n_out: int, k: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    return nnx.Conv(n_in, n_out, (k, k), strides=(stride, stride), padding=((k // 2, k // 2), (k // 2, k // 2)),
                    use_bias=False, rngs=rngs)


class ResNetBlock(nnx.Module):
    """A basic (two 3x3) or bottleneck (1x1, 3x3, 1x1) residual block; the stride sits on the 3x3."""

    def __init__(self, kind: str, n_in: int, width: int, stride: int, *, rngs: nnx.Rngs):
        n_out = width * BLOCKS[kind]
        shapes = [(n_in, width, 3, stride), (width, width, 3, 1)] if kind == "basic" else \
            [(n_in, width, 1, 1), (width, width, 3, stride), (width, n_out, 1, 1)]
        self.convs = nnx.List([_conv(a, b, k, s, rngs) for a, b, k, s in shapes])
        self.norms = nnx.List([nnx.BatchNorm(b, rngs=rngs) for _, b, _, _ in shapes])
        # A 1x1 conv and its batch norm where the shortcut changes shape; empty where it is the identity.
        self.downsample = nnx.List([_conv(n_in, n_out, 1, stride, rngs), nnx.BatchNorm(n_out, rngs=rngs)]
                                   if stride != 1 or n_in != n_out else [])

    def __call__(self, x: jax.Array) -> jax.Array:
        out = x
        for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
            out = norm(conv(out))
            if i < len(self.convs) - 1:
                out = jax.nn.relu(out)
        shortcut = x if not len(self.downsample) else self.downsample[1](self.downsample[0](x))
        return jax.nn.relu(out + shortcut)


class ResNet(nnx.Module):
    """ResNet on NHWC images (`resnet18` is `ResNet("basic", (2, 2, 2, 2))`, `resnet50` is
    `ResNet("bottleneck", (3, 4, 6, 3))`).

    Args:
        block: "basic" or "bottleneck".
        layers: the number of blocks in each of the four stages.
        num_classes: the classifier's outputs.
        width: the first stage's width (64 in the published models).
        rngs: initialisation keys (None: `nnx.Rngs(0)`).
    """

    def __init__(self, block: str = "basic", layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000, *,
                 width: int = 64, rngs: nnx.Rngs | None = None):
        if block not in BLOCKS:
            raise ValueError(f"block must be one of {tuple(BLOCKS)}, got {block!r}")
        if len(layers) != 4 or min(layers) < 1:
            raise ValueError(f"layers must be four positive block counts, e.g. (2, 2, 2, 2), got {layers!r}")
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.block, self.layers = block, tuple(layers)
        self.conv1 = nnx.Conv(3, width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(width, rngs=rngs)
        stages, n_in = [], width
        for i, count in enumerate(layers):
            stage_width = width * 2 ** i
            blocks = []
            for j in range(count):
                blocks.append(ResNetBlock(block, n_in, stage_width, 2 if (j == 0 and i > 0) else 1, rngs=rngs))
                n_in = stage_width * BLOCKS[block]
            stages.append(nnx.List(blocks))
        self.stages = nnx.List(stages)
        self.fc = nnx.Linear(n_in, num_classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.bn1(self.conv1(images)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.fc(jnp.mean(x, axis=(1, 2)))


def _norm(key: str, path: str) -> list[KeyMap]:
    return [KeyMap(f"{key}.weight", f"{path}.scale"), KeyMap(f"{key}.bias", f"{path}.bias"),
            KeyMap(f"{key}.running_mean", f"{path}.mean"), KeyMap(f"{key}.running_var", f"{path}.var")]


def resnet_table(model: ResNet, prefix: str = "") -> tuple[KeyMap, ...]:
    """Every key of a timm/torchvision ResNet state dict for `model`'s depth (`prefix`: e.g. "model.")."""
    table = [KeyMap("conv1.weight", "conv1.kernel", "conv"), *_norm("bn1", "bn1")]
    for i, count in enumerate(model.layers):
        for j in range(count):
            key, path = f"layer{i + 1}.{j}", f"stages.{i}.{j}"
            block = model.stages[i][j]
            for n in range(len(block.convs)):
                table += [KeyMap(f"{key}.conv{n + 1}.weight", f"{path}.convs.{n}.kernel", "conv"),
                          *_norm(f"{key}.bn{n + 1}", f"{path}.norms.{n}")]
            if len(block.downsample):
                table += [KeyMap(f"{key}.downsample.0.weight", f"{path}.downsample.0.kernel", "conv"),
                          *_norm(f"{key}.downsample.1", f"{path}.downsample.1")]
    table += [KeyMap("fc.weight", "fc.kernel", "linear"), KeyMap("fc.bias", "fc.bias")]
    return tuple(KeyMap(prefix + m.key, m.path, m.transform) for m in table)
