"""datarax.host: stages that run on the host before the compiled program (decoding encoded data).

See `datarax.host.stage` for the contract and the record-keyed randomness.
"""

from datarax.host.stage import ENCODED as ENCODED
from datarax.host.stage import HostContext as HostContext
from datarax.host.stage import HostStage as HostStage
from datarax.host.stage import HostStageSource as HostStageSource
from datarax.host.stage import RecordError as RecordError
from datarax.host.stage import record_generator as record_generator
from datarax.host.text import Tokenize as Tokenize
from datarax.host.text import TokenizeConfig as TokenizeConfig
