"""Pretrained weights into Flax NNX: readers, key tables, models, LoRA, probes and warm starts.

Read a checkpoint (`read_pth`: a PyTorch `.pth` without torch and without running its pickle;
`load_safetensors`), fill an NNX module through a key/transpose table (`load_table` with
`resnet_table`, `bert_table`, `crepe_table`), build the input stages from the checkpoint's config
(`preprocessing_stages`), fine-tune (`add_lora` + `lora_optimizer`, `probe_optimizer`,
`discriminative`; all of it as one `FinetuneConfig` for `prepare_finetune`, the `[trainer.finetune]`
table of a configuration file), merge and export (`merge_lora`, `export_table`,
`save_safetensors`), or start from a datarax checkpoint (`warm_start`). No network is needed at
run time. docs/trainers.md, "Pretrained weights and LoRA", is the guide.
"""

from datarax.train.pretrained.bert import BertConfig as BertConfig
from datarax.train.pretrained.bert import BertEncoder as BertEncoder
from datarax.train.pretrained.bert import bert_table as bert_table
from datarax.train.pretrained.crepe import Crepe as Crepe
from datarax.train.pretrained.crepe import crepe_features as crepe_features
from datarax.train.pretrained.crepe import crepe_frames as crepe_frames
from datarax.train.pretrained.crepe import crepe_pitch as crepe_pitch
from datarax.train.pretrained.crepe import crepe_table as crepe_table
from datarax.train.pretrained.crepe import load_crepe as load_crepe
from datarax.train.pretrained.finetune import FinetuneConfig as FinetuneConfig
from datarax.train.pretrained.finetune import check_finetune as check_finetune
from datarax.train.pretrained.finetune import discriminative as discriminative
from datarax.train.pretrained.finetune import prepare_finetune as prepare_finetune
from datarax.train.pretrained.finetune import probe_optimizer as probe_optimizer
from datarax.train.pretrained.finetune import read_weights as read_weights
from datarax.train.pretrained.lora import LoRAConv as LoRAConv
from datarax.train.pretrained.lora import add_lora as add_lora
from datarax.train.pretrained.lora import lora_optimizer as lora_optimizer
from datarax.train.pretrained.lora import merge_lora as merge_lora
from datarax.train.pretrained.preprocess import preprocessing_stages as preprocessing_stages
from datarax.train.pretrained.resnet import ResNet as ResNet
from datarax.train.pretrained.resnet import resnet_table as resnet_table
from datarax.train.pretrained.safetensors import load_safetensors as load_safetensors
from datarax.train.pretrained.safetensors import save_safetensors as save_safetensors
from datarax.train.pretrained.tables import KeyMap as KeyMap
from datarax.train.pretrained.tables import LayoutError as LayoutError
from datarax.train.pretrained.tables import export_table as export_table
from datarax.train.pretrained.tables import load_table as load_table
from datarax.train.pretrained.tables import path_prefixes as path_prefixes
from datarax.train.pretrained.torch_pickle import UnsafePickleError as UnsafePickleError
from datarax.train.pretrained.torch_pickle import read_pth as read_pth
from datarax.train.pretrained.warm_start import WarmStartError as WarmStartError
from datarax.train.pretrained.warm_start import WarmStartReport as WarmStartReport
from datarax.train.pretrained.warm_start import warm_start as warm_start
