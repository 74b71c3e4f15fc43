"""Data sources: random-access record stores that return whole batches per call."""

from datarax.core.source import DataSourceModule as DataSourceModule
from datarax.sources.memory import MemorySource as MemorySource
from datarax.sources.memory import MemorySourceConfig as MemorySourceConfig
from datarax.sources.array_record import ArrayRecordSource as ArrayRecordSource
from datarax.sources.array_record import ArrayRecordSourceConfig as ArrayRecordSourceConfig
from datarax.sources.disk import StreamingDiskSource as StreamingDiskSource
from datarax.sources.disk import StreamingDiskSourceConfig as StreamingDiskSourceConfig
from datarax.sources.grain_interop import GrainSource as GrainSource
from datarax.sources.grain_interop import GrainStreamSource as GrainStreamSource
from datarax.sources.hf import HFSource as HFSource
from datarax.sources.hf import HFSourceConfig as HFSourceConfig
from datarax.sources.hf import HFStreamSource as HFStreamSource
from datarax.sources.image_folder import ImageFolderSource as ImageFolderSource
from datarax.sources.image_folder import ImageFolderSourceConfig as ImageFolderSourceConfig
from datarax.sources._files import CorruptFileError as CorruptFileError
from datarax.sources.mix import MixDataSources as MixDataSources
from datarax.sources.mix import MixDataSourcesConfig as MixDataSourcesConfig
from datarax.sources.packed_text import PackedTextSource as PackedTextSource
from datarax.sources.packed_text import PackedTextSourceConfig as PackedTextSourceConfig
from datarax.sources.stream import StreamSourceModule as StreamSourceModule
from datarax.sources.subset import SubsetSource as SubsetSource
from datarax.sources.text import TextSource as TextSource
from datarax.sources.text import TextSourceConfig as TextSourceConfig
from datarax.sources.tfds import TFDSSource as TFDSSource
from datarax.sources.tfds import TFDSSourceConfig as TFDSSourceConfig
