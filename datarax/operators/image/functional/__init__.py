"""The maths of the image operators: pure functions on one float HWC image, jittable and differentiable.

Use them on their own, as with `torchvision.transforms.functional` or dm-pix:

    >>> from datarax.operators.image import functional as F
    >>> out = F.adjust_brightness(image, 1.2)      # PIL ImageEnhance.Brightness(image).enhance(1.2)

Each family module (`color`, `geometry`, `filters`, `mix`, `beta`) documents its reference.
"""

from datarax.core.noise import standard_normal as standard_normal  # the draw gaussian_noise adds
from datarax.operators.image.functional import beta as beta
from datarax.operators.image.functional import color as color
from datarax.operators.image.functional import filters as filters
from datarax.operators.image.functional import geometry as geometry
from datarax.operators.image.functional import mix as mix
from datarax.operators.image.functional.beta import symmetric_beta as symmetric_beta
from datarax.operators.image.functional.color import adjust_brightness as adjust_brightness
from datarax.operators.image.functional.color import adjust_contrast as adjust_contrast
from datarax.operators.image.functional.color import adjust_gamma as adjust_gamma
from datarax.operators.image.functional.color import adjust_hue as adjust_hue
from datarax.operators.image.functional.color import adjust_saturation as adjust_saturation
from datarax.operators.image.functional.color import hsv_to_rgb as hsv_to_rgb
from datarax.operators.image.functional.color import normalize as normalize
from datarax.operators.image.functional.color import rgb_to_grayscale as rgb_to_grayscale
from datarax.operators.image.functional.color import rgb_to_hsv as rgb_to_hsv
from datarax.operators.image.functional.color import solarize as solarize
from datarax.operators.image.functional.color import standardize as standardize
from datarax.operators.image.functional.color import to_grayscale as to_grayscale
from datarax.operators.image.functional.filters import box_mask as box_mask
from datarax.operators.image.functional.filters import cutout as cutout
from datarax.operators.image.functional.filters import gaussian_blur as gaussian_blur
from datarax.operators.image.functional.filters import gaussian_kernel as gaussian_kernel
from datarax.operators.image.functional.filters import gaussian_noise as gaussian_noise
from datarax.operators.image.functional.filters import occlude as occlude
from datarax.operators.image.functional.filters import patch_grid_mask as patch_grid_mask
from datarax.operators.image.functional.geometry import affine_matrix as affine_matrix
from datarax.operators.image.functional.geometry import crop as crop
from datarax.operators.image.functional.geometry import hflip as hflip
from datarax.operators.image.functional.geometry import pad as pad
from datarax.operators.image.functional.geometry import resize as resize
from datarax.operators.image.functional.geometry import resized_crop as resized_crop
from datarax.operators.image.functional.geometry import rotate as rotate
from datarax.operators.image.functional.geometry import translate as translate
from datarax.operators.image.functional.geometry import vflip as vflip
from datarax.operators.image.functional.geometry import warp_affine as warp_affine
from datarax.operators.image.functional.mix import cutmix as cutmix
from datarax.operators.image.functional.mix import mixup as mixup
from datarax.operators.image.functional.mix import partners as partners
