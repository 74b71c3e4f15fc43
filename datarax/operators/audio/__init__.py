"""Differentiable audio operators for 1-D waveforms and their spectrograms.

The maths lives in pure functions by family, usable on their own under `jax.jit`/`jax.vmap`
(`waveform`, `resample`, `spectral`, `mel`, `masking`, `pcen`, `loudness`); the operators wrap
them with a config, the record key stream and optional learnable magnitudes.
"""

from datarax.operators.audio import loudness as loudness
from datarax.operators.audio import masking as masking
from datarax.operators.audio import mel as mel
from datarax.operators.audio import pcen as pcen
from datarax.operators.audio import resample as resample
from datarax.operators.audio import spectral as spectral
from datarax.operators.audio import waveform as waveform
from datarax.operators.audio.base import AudioOperator as AudioOperator
from datarax.operators.audio.base import AudioOperatorConfig as AudioOperatorConfig
from datarax.operators.audio.base import ChannelMagnitude as ChannelMagnitude
from datarax.operators.audio.waveform_ops import AddNoiseConfig as AddNoiseConfig
from datarax.operators.audio.waveform_ops import AddNoiseOperator as AddNoiseOperator
from datarax.operators.audio.waveform_ops import CropPadConfig as CropPadConfig
from datarax.operators.audio.waveform_ops import CropPadOperator as CropPadOperator
from datarax.operators.audio.waveform_ops import GainConfig as GainConfig
from datarax.operators.audio.waveform_ops import GainOperator as GainOperator
from datarax.operators.audio.waveform_ops import ResampleConfig as ResampleConfig
from datarax.operators.audio.waveform_ops import ResampleOperator as ResampleOperator
from datarax.operators.audio.waveform_ops import TimeShiftConfig as TimeShiftConfig
from datarax.operators.audio.waveform_ops import TimeShiftOperator as TimeShiftOperator
from datarax.operators.audio.feature_ops import LogMelConfig as LogMelConfig
from datarax.operators.audio.feature_ops import LogMelOperator as LogMelOperator
from datarax.operators.audio.feature_ops import LoudnessConfig as LoudnessConfig
from datarax.operators.audio.feature_ops import LoudnessOperator as LoudnessOperator
from datarax.operators.audio.feature_ops import MelSpectrogramConfig as MelSpectrogramConfig
from datarax.operators.audio.feature_ops import MelSpectrogramOperator as MelSpectrogramOperator
from datarax.operators.audio.feature_ops import MFCCConfig as MFCCConfig
from datarax.operators.audio.feature_ops import MFCCOperator as MFCCOperator
from datarax.operators.audio.feature_ops import STFTConfig as STFTConfig
from datarax.operators.audio.feature_ops import STFTOperator as STFTOperator
from datarax.operators.audio.masking_ops import FrequencyMaskConfig as FrequencyMaskConfig
from datarax.operators.audio.masking_ops import FrequencyMaskOperator as FrequencyMaskOperator
from datarax.operators.audio.masking_ops import TimeMaskConfig as TimeMaskConfig
from datarax.operators.audio.masking_ops import TimeMaskOperator as TimeMaskOperator
from datarax.operators.audio.pcen_ops import PCENConfig as PCENConfig
from datarax.operators.audio.pcen_ops import PCENOperator as PCENOperator
from datarax.operators.audio import synth as synth
from datarax.operators.audio.synth import FilteredNoiseConfig as FilteredNoiseConfig
from datarax.operators.audio.synth import FilteredNoiseOperator as FilteredNoiseOperator
from datarax.operators.audio.synth import HarmonicSynthConfig as HarmonicSynthConfig
from datarax.operators.audio.synth import HarmonicSynthOperator as HarmonicSynthOperator
from datarax.operators.audio.synth import ReverbConfig as ReverbConfig
from datarax.operators.audio.synth import ReverbOperator as ReverbOperator
