"""Discovery of built-in operators, sources and samplers by name; import paths."""

import inspect

import pytest

import datarax.operators.image as image_ops
import datarax.operators.strategies as strategies
from datarax.config import registry
from datarax.core.operator import OperatorModule


@pytest.mark.parametrize("class_name,suffixes,name", [
    ("BrightnessOperator", ("Operator",), "brightness"),
    ("RandomResizedCropOperator", ("Operator",), "random_resized_crop"),
    ("STFTOperator", ("Operator",), "stft"),
    ("MelSpectrogramOperator", ("Operator",), "mel_spectrogram"),
    ("PCENOperator", ("Operator",), "pcen"),
    ("RebatchNode", ("Operator", "Node"), "rebatch"),
    ("SplitField", ("Operator", "Node"), "split_field"),
    ("MemorySource", ("Source",), "memory"),
    ("ArrayRecordSource", ("Source",), "array_record"),
    ("SlidingWindowSampler", ("Sampler",), "sliding_window"),
    ("Operator", ("Operator",), "operator"),
])
def test_snake_name(class_name, suffixes, name):
    assert registry.snake_name(class_name, suffixes) == name


@pytest.mark.parametrize("kind,name,class_name,config_name", [
    ("operator", "brightness", "BrightnessOperator", "BrightnessConfig"),
    ("operator", "horizontal_flip", "HorizontalFlipOperator", "HorizontalFlipConfig"),
    ("operator", "element", "ElementOperator", "ElementOperatorConfig"),
    ("operator", "parallel", "ParallelOperator", "ParallelOperatorConfig"),
    ("operator", "sequential", "SequentialOperator", None),
    ("source", "memory", "MemorySource", "MemorySourceConfig"),
    ("source", "packed_text", "PackedTextSource", "PackedTextSourceConfig"),  # a stream
    ("source", "hf_stream", "HFStreamSource", "HFSourceConfig"),
    ("source", "materialized", "MaterializedSource", "MaterializedSourceConfig"),
    ("host_stage", "decode_image", "DecodeImage", "DecodeImageConfig"),
    ("host_stage", "decode_audio", "DecodeAudio", "DecodeAudioConfig"),
    ("host_stage", "tokenize", "Tokenize", "TokenizeConfig"),
    ("host_stage", "host_map", "HostMap", "HostMapConfig"),
    ("sampler", "shuffle", "ShuffleSampler", None),
])
def test_known_classes_are_found_with_their_configs(kind, name, class_name, config_name):
    entries, ambiguous, _ = registry.discover(kind)
    assert not ambiguous
    entry = entries[name]
    assert entry.cls.__name__ == class_name
    assert (entry.config_cls.__name__ if entry.config_cls else None) == config_name


@pytest.mark.parametrize("package", [image_ops, strategies])
def test_every_exported_concrete_operator_is_registered(package):
    exported = {obj for obj in vars(package).values()
                if inspect.isclass(obj) and issubclass(obj, OperatorModule) and not inspect.isabstract(obj)
                and obj.__name__.endswith("Operator")}
    registered = {entry.cls for entry in registry.discover("operator")[0].values()}
    assert exported and exported <= registered


def test_every_exported_host_stage_is_registered():
    import datarax.host as host
    from datarax.host.stage import HostStage

    exported = {obj for obj in vars(host).values()
                if inspect.isclass(obj) and issubclass(obj, HostStage) and not inspect.isabstract(obj)}
    assert {e.cls for e in registry.discover("host_stage")[0].values()} == exported
    assert "host_stage_source" not in registry.discover("source")[0]  # the pipeline's own wrapper is not a source


def test_import_object_finds_modules_next_to_the_config(tmp_path):
    (tmp_path / "my_near_module.py").write_text("def make():\n    return 41 + 1\n")
    assert registry.import_object("my_near_module:make", [str(tmp_path)])() == 42


@pytest.mark.parametrize("spec,error,words", [
    ("no_colon.here", ValueError, r"import path 'no_colon\.here' is not of the form 'package\.module:attribute'"),
    ("datarax_no_such_module:f", ModuleNotFoundError, r"No module named 'datarax_no_such_module'"),
    ("datarax.config.registry:import_objekt", AttributeError,
     r"module 'datarax\.config\.registry' has no attribute 'import_objekt'; did you mean 'import_object'\?"),
])
def test_import_object_errors(spec, error, words):
    with pytest.raises(error, match=words):
        registry.import_object(spec)


def test_an_error_inside_the_imported_module_is_not_hidden(tmp_path):
    (tmp_path / "broken_dep_module.py").write_text("import datarax_missing_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="datarax_missing_dependency"):
        registry.import_object("broken_dep_module:f", [str(tmp_path)])
