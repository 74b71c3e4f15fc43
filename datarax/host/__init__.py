"""datarax.host: stages that run on the host before the compiled program (decoding encoded data).

`DecodeImage`, `DecodeAudio`, `Tokenize`, `HostMap` (any Python function), and `materialize`
(decode an image source once into a reduced cache). To write a stage of your own, subclass
`HostStage` (or `DecodingStage`, for one that decodes record by record on a thread pool);
`datarax.host.stage` has the contract, and `HostContext` is what a stage's `__call__` receives.
"""

from datarax.control.processes import WorkerCrashError as WorkerCrashError
from datarax.host.audio import DecodeAudio as DecodeAudio
from datarax.host.audio import DecodeAudioConfig as DecodeAudioConfig
from datarax.host.decode_once import materialize as materialize
from datarax.host.image import DecodeImage as DecodeImage
from datarax.host.image import DecodeImageConfig as DecodeImageConfig
from datarax.host.map import HostMap as HostMap
from datarax.host.map import HostMapConfig as HostMapConfig
from datarax.host.stage import DecodingStage as DecodingStage
from datarax.host.stage import HostContext as HostContext
from datarax.host.stage import HostStage as HostStage
from datarax.host.stage import SkippedRecordWarning as SkippedRecordWarning
from datarax.host.text import Tokenize as Tokenize
from datarax.host.text import TokenizeConfig as TokenizeConfig
