"""The restricted `.pth` reader against torch.load, on hand-built archives (no torch needed) and torch's own."""

from __future__ import annotations

import collections
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

from datarax.train.pretrained.torch_pickle import UnsafePickleError, read_pth


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)


def _ints(values) -> bytes:
    return b"(" + b"".join(_int(v) for v in values) + b"t"


def _global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


EMPTY_ORDERED_DICT = _global("collections", "OrderedDict") + b")R"


def state_dict_pickle(entries) -> bytes:
    """The protocol-2 pickle `torch.save` writes for a state dict, opcode by opcode: an OrderedDict
    whose values are `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False,
    OrderedDict())` calls, each storage a persistent id ("storage", torch.<Kind>Storage, key, "cpu", numel)."""
    out = b"\x80\x02" + EMPTY_ORDERED_DICT + b"("
    for key, kind, storage_key, numel, offset, size, stride in entries:
        storage = (b"(" + _text("storage") + _global("torch", kind) + _text(storage_key) + _text("cpu")
                   + _int(numel) + b"t" + b"Q")
        out += (_text(key) + _global("torch._utils", "_rebuild_tensor_v2") + b"(" + storage + _int(offset)
                + _ints(size) + _ints(stride) + b"\x89" + EMPTY_ORDERED_DICT + b"t" + b"R")
    return out + b"u" + b"."


KINDS = {np.dtype(np.float32): "FloatStorage", np.dtype(np.int64): "LongStorage", np.dtype(np.float16): "HalfStorage"}


def write_pth(path, tensors: dict[str, np.ndarray], *, prefix: str = "archive") -> None:
    """A `torch.save` zip archive of `tensors` (contiguous), built without torch."""
    entries, storages = [], {}
    for i, (key, array) in enumerate(tensors.items()):
        array = np.asarray(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        storages[str(i)] = array.tobytes()
        stride = tuple(s // array.itemsize for s in array.strides)
        entries.append((key, KINDS[array.dtype], str(i), array.size, 0, array.shape, stride))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{prefix}/data.pkl", state_dict_pickle(entries))
        archive.writestr(f"{prefix}/byteorder", "little")
        for key, raw in storages.items():
            archive.writestr(f"{prefix}/data/{key}", raw)
        archive.writestr(f"{prefix}/version", "3\n")


TENSORS = {
    "conv.weight": np.arange(2 * 3 * 5 * 1, dtype=np.float32).reshape(2, 3, 5, 1) / 7,
    "conv.bias": np.array([-1.5, 2.25], np.float32),
    "bn.num_batches_tracked": np.array(7, np.int64),
    "fc.weight": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "half": np.array([0.5, -2.0, 65504.0], np.float16),
}


def test_a_hand_built_archive_reads_back_exactly(tmp_path):
    path = tmp_path / "hand.pth"
    write_pth(path, TENSORS)
    read = read_pth(path)
    assert list(read) == list(TENSORS)
    for key, array in TENSORS.items():
        assert read[key].dtype == array.dtype and read[key].shape == array.shape
        np.testing.assert_array_equal(read[key], array)


def test_offsets_and_strides_of_a_shared_storage(tmp_path):
    base = np.arange(24, dtype=np.float32)
    entries = [("t", "FloatStorage", "0", 24, 0, (4, 6), (1, 4)),      # a transposed (6, 4) matrix
               ("s", "FloatStorage", "0", 24, 5, (2, 3), (6, 2))]      # an offset, strided slice
    path = tmp_path / "shared.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a/data.pkl", state_dict_pickle(entries))
        archive.writestr("a/data/0", base.tobytes())
    read = read_pth(path)
    np.testing.assert_array_equal(read["t"], base.reshape(6, 4).T)
    np.testing.assert_array_equal(read["s"], base[5:].reshape(-1)[np.arange(2)[:, None] * 6 + np.arange(3) * 2])


def test_the_hand_built_archive_is_what_torch_load_reads(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the hand-built archive is checked by the "
                                                "reader only")
    path = tmp_path / "hand.pth"
    write_pth(path, TENSORS)
    loaded = torch.load(path, weights_only=True)
    for key, array in TENSORS.items():
        np.testing.assert_array_equal(loaded[key].numpy(), array)


def test_torch_save_archives_read_like_torch_load(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=generator)
    state = collections.OrderedDict([
        ("linear.weight", torch.nn.Parameter(torch.randn(4, 3, generator=generator))),
        ("transposed", base.t()),                       # a non-contiguous view: strides matter
        ("sliced", base[2:5, 1:7:2]),                   # an offset into a shared storage
        ("int", torch.arange(5)), ("bf16", torch.randn(3, generator=generator).bfloat16()),
        ("scalar", torch.tensor(3.5)), ("bool", torch.tensor([True, False])),
    ])
    path = tmp_path / "torch.pth"
    torch.save(state, path)
    read = read_pth(path)
    assert list(read) == list(state)
    for key, tensor in state.items():
        expected = tensor.detach().float().numpy() if key == "bf16" else tensor.detach().numpy()
        got = read[key].astype(np.float32) if key == "bf16" else read[key]
        assert got.shape == expected.shape, key
        np.testing.assert_array_equal(got, expected, err_msg=key)
    assert str(read["bf16"].dtype) == "bfloat16"


def test_a_wrapped_state_dict_is_flattened(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {"w": torch.ones(2)}, "epoch": 3}, path)
    assert list(read_pth(path)) == ["state_dict.w"]


class _Evil:
    def __reduce__(self):
        return os.system, ("echo pwned > /dev/null",)


@pytest.mark.parametrize("payload,global_name", [
    (_Evil(), "system"),
    (collections.OrderedDict(w=_Evil()), "system"),
])
def test_a_pickle_that_names_another_global_is_refused(tmp_path, payload, global_name):
    path = tmp_path / "evil.pth"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))
    with pytest.raises(UnsafePickleError) as info:
        read_pth(path)
    message = str(info.value)
    assert str(path) in message and f".{global_name}" in message and ("posix" in message or "os" in message)


def test_a_legacy_or_foreign_file_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "legacy.pth"
    path.write_bytes(pickle.dumps({"w": 1}))
    with pytest.raises(ValueError, match="not a PyTorch zip archive"):
        read_pth(path)
