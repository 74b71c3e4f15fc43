"""The maths of the audio operators: pure functions on waveforms `(..., T)` and spectrograms `(..., F, T)`.

Jittable, vmappable and differentiable; each family module (`waveform`, `resample`,
`spectral`, `mel`, `masking`, `pcen`, `loudness`, `synth`) documents its reference (librosa,
SciPy, DDSP). `resample` and `pcen` name both a module and its main function; here they name
the module (`F.resample.resample`, `F.pcen.pcen`). Use them on their own, as with `torchaudio.functional`:

    >>> from datarax.operators.audio import functional as F
    >>> log_mel = F.log_mel_spectrogram(waveform, sample_rate=16000, n_fft=512, hop_length=160, n_mels=64)
"""

from datarax.operators.audio.functional import loudness as loudness
from datarax.operators.audio.functional import masking as masking
from datarax.operators.audio.functional import mel as mel
from datarax.operators.audio.functional import pcen as pcen
from datarax.operators.audio.functional import resample as resample
from datarax.operators.audio.functional import spectral as spectral
from datarax.operators.audio.functional import synth as synth
from datarax.operators.audio.functional import waveform as waveform
from datarax.operators.audio.functional.loudness import a_weighted_loudness as a_weighted_loudness
from datarax.operators.audio.functional.loudness import a_weighting_db as a_weighting_db
from datarax.operators.audio.functional.masking import apply_masks as apply_masks
from datarax.operators.audio.functional.masking import draw_masks as draw_masks
from datarax.operators.audio.functional.mel import hz_to_mel as hz_to_mel
from datarax.operators.audio.functional.mel import log_mel_spectrogram as log_mel_spectrogram
from datarax.operators.audio.functional.mel import mel_filterbank as mel_filterbank
from datarax.operators.audio.functional.mel import mel_spectrogram as mel_spectrogram
from datarax.operators.audio.functional.mel import mel_to_hz as mel_to_hz
from datarax.operators.audio.functional.mel import mfcc as mfcc
from datarax.operators.audio.functional.mel import power_to_db as power_to_db
from datarax.operators.audio.functional.pcen import smoothing_coefficient as smoothing_coefficient
from datarax.operators.audio.functional.spectral import fft_frequencies as fft_frequencies
from datarax.operators.audio.functional.spectral import multi_scale_stft_magnitude as multi_scale_stft_magnitude
from datarax.operators.audio.functional.spectral import stft as stft
from datarax.operators.audio.functional.spectral import stft_magnitude as stft_magnitude
from datarax.operators.audio.functional.spectral import window as window
from datarax.operators.audio.functional.synth import decaying_noise_ir as decaying_noise_ir
from datarax.operators.audio.functional.synth import filtered_noise as filtered_noise
from datarax.operators.audio.functional.synth import harmonic_synth as harmonic_synth
from datarax.operators.audio.functional.synth import reverb as reverb
from datarax.operators.audio.functional.waveform import add_noise as add_noise
from datarax.operators.audio.functional.waveform import apply_gain as apply_gain
from datarax.operators.audio.functional.waveform import crop_or_pad as crop_or_pad
from datarax.operators.audio.functional.waveform import db_to_amplitude as db_to_amplitude
from datarax.operators.audio.functional.waveform import rms as rms
from datarax.operators.audio.functional.waveform import time_shift as time_shift
