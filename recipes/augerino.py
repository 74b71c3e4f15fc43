"""Augerino (Benton et al. 2020) on datarax stages: the policy stage, the regularised loss, a tracker.

The policy is an ordinary pipeline stage, so `Trainer(..., train_pipeline_params=True)` trains
its magnitudes with the classifier. It writes the vector `w` of its learnable widths, each in its
natural unit (a rotation's half-width in radians), into the batch, and the loss is

    cross-entropy(model(augmented batch)) - lam * ||w||_2

(`augerino_loss`), the objective of the authors' reference code (`unif_aug_loss` in
github.com/g-benton/learning-invariances: `base_loss - reg * width.norm()`). The regulariser
*rewards* width: without it the training loss alone always prefers no augmentation (an
un-augmented batch is the easiest to fit), with it the width grows until widening further
costs more cross-entropy than `lam` pays per radian. Where the data really is invariant to the
transform, wider augmentation costs (almost) no cross-entropy, so the width runs to the whole
group. The reference code's width is the *full* width of the uniform draw (`U(-w/2, w/2)`);
here it is the half-width (`U(-w, w)`, datarax's `degrees`), so our `lam` equals twice theirs.

The regulariser reads only the magnitude's *value* (`Magnitude.__call__`), so it does not depend
on how the operator parameterises it internally (datarax's learnable magnitudes are
`low + (high - low) * sigmoid(raw)`; a rotation's range (0, 180) degrees is the whole rotation
group, so that bound is the transform's own, not an arbitrary cap).

`AffineLieOperator` is the authors' other policy (`UniformAug`): six widths, one per generator of
the affine group's Lie algebra (translation x and y, rotation, uniform scale, stretch, shear),
each coefficient drawn uniformly and the warp the matrix exponential of their sum. Started as
the authors started it on rotated MNIST (`AUTHORS_START`), it asks whether Augerino finds
*which* transform the data is invariant to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx
from jax.scipy.linalg import expm

from datarax.core.element import Element
from datarax.core.operator import BatchContext, OperatorConfig, OperatorModule
from datarax.operators.field import check_magnitudes
from datarax.operators.image.base import ImageOperator, ImageOperatorConfig, check_fill, signed, uniforms
from datarax.operators.image.functional import geometry
from datarax.train.callbacks import Callback, StepLogs
from recipes.models import classification_loss

if TYPE_CHECKING:
    from datarax.train import Trainer

WIDTH_FIELD = "aug_widths"
RADIANS_PER_DEGREE = jnp.pi / 180.0


class AugmentationPolicy(OperatorModule):
    """Applies `operators` in order and writes their learnable widths, in natural units, into the batch.

    Args:
        operators: image operators with learnable magnitudes.
        units: for every learnable magnitude (keyed `Operator.name` as in `magnitudes()`, e.g.
            `"Rotation.degrees"`), the factor that turns its value into its natural unit (for
            degrees `RADIANS_PER_DEGREE`). Every learnable magnitude must be listed: a width
            without a unit would make the regulariser depend on an arbitrary scale.
    """

    def __init__(self, operators: Sequence[OperatorModule], units: Mapping[str, float]):
        self.config = OperatorConfig()
        self.operators = nnx.List(list(operators))
        self.units = {k: float(v) for k, v in units.items()}
        names = set(self.magnitudes())
        unknown, missing = sorted(set(self.units) - names), sorted(names - set(self.units))
        if unknown:
            raise ValueError(f"units names {unknown}, which are not learnable magnitudes of the policy; "
                             f"choose from {sorted(names)}")
        if missing:
            raise ValueError(f"units gives no unit for the learnable magnitudes {missing}; add e.g. "
                             f"{{{missing[0]!r}: RADIANS_PER_DEGREE}}")
        if not names:
            raise ValueError("the policy has no learnable magnitude: pass operators built with learnable=True")

    def magnitudes(self) -> dict[str, nnx.Module]:
        """The learnable magnitudes of the operators, keyed `Operator.name`."""
        out = {}
        for op in self.operators:
            for name, magnitude in getattr(op, "magnitudes", {}).items():
                if magnitude.learnable:
                    out[f"{type(op).__name__.removesuffix('Operator')}.{name}"] = magnitude
        return out

    def widths(self) -> dict[str, jax.Array]:
        """Each learnable magnitude's current value times its unit (its width in natural units)."""
        return {k: m() * self.units[k] for k, m in self.magnitudes().items()}

    def values(self) -> dict[str, jax.Array]:
        """Each learnable magnitude's current value in the operator's own unit (e.g. degrees)."""
        return {k: m() for k, m in self.magnitudes().items()}

    def apply_batch(self, elements: Element, ctx: BatchContext) -> Element:
        for op in self.operators:
            elements = op.apply_batch(elements, ctx)
        widths = jnp.stack(list(self.widths().values()))
        # Per-record fields must have the batch as their leading axis; every row is the same vector.
        return elements.update_data({WIDTH_FIELD: jnp.broadcast_to(widths, (*ctx.record_ids.shape, widths.size))})

    def structure(self) -> str:
        return (f"AugmentationPolicy(units={sorted(self.units.items())})["
                + ", ".join(op.structure() for op in self.operators) + "]")


def width_regulariser(widths: jax.Array, lam: float) -> jax.Array:
    """`lam * ||widths||_2`: what the Augerino loss subtracts (widths in natural units)."""
    return lam * jnp.sqrt(jnp.sum(jnp.square(widths)))


def augerino_loss(lam: float):
    """`loss_fn(model, batch)`: cross-entropy minus `width_regulariser` of the policy's widths.

    The widths come from the batch's `WIDTH_FIELD` (written by `AugmentationPolicy`); a batch
    without it (evaluation) gets plain cross-entropy.
    """

    def loss_fn(model: nnx.Module, batch: dict):
        loss, logits = classification_loss(model, batch)
        if WIDTH_FIELD in batch:
            loss = loss - width_regulariser(batch[WIDTH_FIELD][0], lam)
        return loss, logits

    return loss_fn


def policy_values(policy: AugmentationPolicy) -> dict[str, float]:
    """Host values of the policy's learnable magnitudes, in the operators' own units."""
    return {k: float(v) for k, v in policy.values().items()}


class PolicyTracker(Callback):
    """Records the policy's magnitudes every `every` steps, at step 1 and at the last step."""

    def __init__(self, policy: AugmentationPolicy, every: int):
        self.policy = policy
        self.every = every
        self.history: list[dict] = []

    def on_step_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if logs.step % self.every == 0 or logs.step == 1:
            self.history.append({"step": logs.step, **policy_values(self.policy)})

    def on_train_end(self, trainer: Trainer, logs: StepLogs) -> None:
        if not self.history or self.history[-1]["step"] != logs.step:
            self.history.append({"step": logs.step, **policy_values(self.policy)})

    def get_state(self) -> dict:
        return {"history": self.history}

    def set_state(self, state: dict) -> None:
        self.history = list(state.get("history", []))


# ------------------------------------------------------------------ the six affine generators (UniformAug)

AFFINE_GENERATORS = ("translate_x", "translate_y", "rotation", "scale", "stretch", "shear")
TRANSLATION_SCALE = 0.1  # the reference code's trans_scale: a translation coefficient c shifts by 0.1 c


def affine_generators() -> jax.Array:
    """The six 3x3 generators, acting on normalised homogeneous coordinates (x, y, 1) in [-1, 1].

    In `AFFINE_GENERATORS` order, as in the reference `UniformAug.generate`: translations scaled
    by `TRANSLATION_SCALE`, rotation `[[0, -1], [1, 0]]`, uniform scale `I`, stretch
    `diag(1, -1)`, shear `[[0, 1], [1, 0]]`.
    """
    g = jnp.zeros((6, 3, 3))
    g = g.at[0, 0, 2].set(TRANSLATION_SCALE).at[1, 1, 2].set(TRANSLATION_SCALE)
    g = g.at[2, 0, 1].set(-1.0).at[2, 1, 0].set(1.0)
    g = g.at[3, 0, 0].set(1.0).at[3, 1, 1].set(1.0)
    g = g.at[4, 0, 0].set(1.0).at[4, 1, 1].set(-1.0)
    return g.at[5, 0, 1].set(1.0).at[5, 1, 0].set(1.0)


def lie_affine_inverse(coefficients: jax.Array, height: int, width: int) -> jax.Array:
    """The 2x3 pixel-coordinate sampling map of `expm(sum_i c_i G_i)` (see `affine_generators`).

    As in the reference (`F.affine_grid(..., align_corners=True)`), the exponential maps each
    output position, in normalised coordinates (-1 and 1 at the centres of the edge pixels), to the
    input position it samples; here that map is conjugated into pixel coordinates for
    `geometry.warp_affine`.
    """
    matrix = expm(jnp.tensordot(coefficients, affine_generators().astype(coefficients.dtype), axes=1))
    half_x, half_y = (width - 1) / 2.0, (height - 1) / 2.0
    to_pixels = jnp.array([[half_x, 0.0, half_x], [0.0, half_y, half_y], [0.0, 0.0, 1.0]], coefficients.dtype)
    to_unit = jnp.array([[1.0 / half_x, 0.0, -1.0], [0.0, 1.0 / half_y, -1.0], [0.0, 0.0, 1.0]], coefficients.dtype)
    return (to_pixels @ matrix @ to_unit)[:2]


@dataclasses.dataclass(frozen=True)
class AffineLieConfig(ImageOperatorConfig):
    """Configuration of `AffineLieOperator`: each field is the half-width of its generator's coefficient.

    Attributes:
        translate_x, translate_y: in units of `TRANSLATION_SCALE` normalised widths (a coefficient
            of 10 shifts by half the image), in [0, 10].
        rotation: radians, in [0, pi] (pi: the whole rotation group).
        scale, stretch, shear: log-scale coefficients (a scale coefficient c zooms by `e**c`), in [0, 1].
        fill: value read outside the source image (the reference's zero padding is 0).
    """

    stochastic: bool = True
    translate_x: float = 0.0
    translate_y: float = 0.0
    rotation: float = 0.0
    scale: float = 0.0
    stretch: float = 0.0
    shear: float = 0.0
    fill: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_magnitudes(self, AffineLieOperator.bounds)
        check_fill(self)


# The reference code's start on rotated MNIST (experiments/rotmnist/runner.py): raw widths -5, and
# 1 for rotation, read through softplus as *full* widths; halved here, since our magnitudes are
# half-widths. Rotation starts at 0.657 rad (37.6 degrees), every other generator at 0.0034.
AUTHORS_START = {name: float(jax.nn.softplus(1.0 if name == "rotation" else -5.0)) / 2.0
                 for name in AFFINE_GENERATORS}


class AffineLieOperator(ImageOperator):
    """A random affine warp `expm(sum_i c_i G_i)`, `c_i ~ U(-w_i, w_i)`, over the six generators.

    The draw is reparameterised (`c_i = w_i (2 u_i - 1)`) and the exponential and the bilinear
    sampling are differentiable, so learnable widths train through it.
    """

    config_class = AffineLieConfig
    separate_on_cpu = True
    bounds = {"translate_x": (0.0, 10.0), "translate_y": (0.0, 10.0), "rotation": (0.0, float(jnp.pi)),
              "scale": (0.0, 1.0), "stretch": (0.0, 1.0), "shear": (0.0, 1.0)}

    def draw(self, key, shape):
        unit = uniforms(key, len(AFFINE_GENERATORS))
        return {"coefficients": jnp.stack([signed(None if unit is None else unit[i], self.magnitude(name))
                                           for i, name in enumerate(AFFINE_GENERATORS)])}

    def apply(self, image, params):
        inverse = lie_affine_inverse(params["coefficients"].astype(image.dtype), *image.shape[:2])
        return geometry.warp_affine(image, inverse, self.config.fill)
