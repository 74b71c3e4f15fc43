"""Differentiable audio operators for 1-D waveforms and their spectrograms.

The operators live in modules by family (`waveform`, `features`, `masking`, `pcen`, `synth`);
each wraps the pure maths of `functional` (usable on its own under `jax.jit`/`jax.vmap`) with a
config, the record key stream and optional learnable magnitudes.
"""

from datarax.operators.audio import functional as functional
from datarax.operators.audio.base import AudioOperator as AudioOperator
from datarax.operators.audio.base import AudioOperatorConfig as AudioOperatorConfig
from datarax.operators.audio.features import LogMelConfig as LogMelConfig
from datarax.operators.audio.features import LogMelOperator as LogMelOperator
from datarax.operators.audio.features import LoudnessConfig as LoudnessConfig
from datarax.operators.audio.features import LoudnessOperator as LoudnessOperator
from datarax.operators.audio.features import MelSpectrogramConfig as MelSpectrogramConfig
from datarax.operators.audio.features import MelSpectrogramOperator as MelSpectrogramOperator
from datarax.operators.audio.features import MFCCConfig as MFCCConfig
from datarax.operators.audio.features import MFCCOperator as MFCCOperator
from datarax.operators.audio.features import STFTConfig as STFTConfig
from datarax.operators.audio.features import STFTOperator as STFTOperator
from datarax.operators.audio.masking import FrequencyMaskConfig as FrequencyMaskConfig
from datarax.operators.audio.masking import FrequencyMaskOperator as FrequencyMaskOperator
from datarax.operators.audio.masking import TimeMaskConfig as TimeMaskConfig
from datarax.operators.audio.masking import TimeMaskOperator as TimeMaskOperator
from datarax.operators.audio.pcen import PCENConfig as PCENConfig
from datarax.operators.audio.pcen import PCENOperator as PCENOperator
from datarax.operators.audio.synth import FilteredNoiseConfig as FilteredNoiseConfig
from datarax.operators.audio.synth import FilteredNoiseOperator as FilteredNoiseOperator
from datarax.operators.audio.synth import HarmonicSynthConfig as HarmonicSynthConfig
from datarax.operators.audio.synth import HarmonicSynthOperator as HarmonicSynthOperator
from datarax.operators.audio.synth import ReverbConfig as ReverbConfig
from datarax.operators.audio.synth import ReverbOperator as ReverbOperator
from datarax.operators.audio.waveform import AddNoiseConfig as AddNoiseConfig
from datarax.operators.audio.waveform import AddNoiseOperator as AddNoiseOperator
from datarax.operators.audio.waveform import CropPadConfig as CropPadConfig
from datarax.operators.audio.waveform import CropPadOperator as CropPadOperator
from datarax.operators.audio.waveform import GainConfig as GainConfig
from datarax.operators.audio.waveform import GainOperator as GainOperator
from datarax.operators.audio.waveform import ResampleConfig as ResampleConfig
from datarax.operators.audio.waveform import ResampleOperator as ResampleOperator
from datarax.operators.audio.waveform import TimeShiftConfig as TimeShiftConfig
from datarax.operators.audio.waveform import TimeShiftOperator as TimeShiftOperator
from datarax.operators.learnable import ChannelMagnitude as ChannelMagnitude
