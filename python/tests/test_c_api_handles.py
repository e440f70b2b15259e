"""torch_tern.c_api: tern's own handles for PyTorch's objects, used through ctypes."""

import ctypes

import pytest
import torch

import torch_tern
from torch_tern import c_api

P = ctypes.c_void_p
U64 = ctypes.c_uint64
ONE_F32 = 0x3F800000  # bit pattern of 1.0f


def _fill(queue, tensor_or_handle, offset, nbytes, pattern=ONE_F32):
    lib = c_api.library()
    if isinstance(tensor_or_handle, torch.Tensor):
        handle, base = c_api.buffer(tensor_or_handle)
        offset += base
    else:
        handle = tensor_or_handle
    status = lib.tern_queue_fill(P(queue), P(handle), U64(offset), U64(nbytes),
                                 ctypes.c_uint32(pattern), None)
    assert status == 0, f"tern_queue_fill returned {status}"


def test_library_is_the_plugins_own():
    lib = c_api.library()
    assert c_api.library() is lib

    class Version(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("major", ctypes.c_uint32),
                    ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32),
                    ("build", ctypes.c_char_p)]

    version = Version(struct_size=ctypes.sizeof(Version))
    assert lib.tern_get_version(ctypes.byref(version)) == 0
    plugin = torch_tern._C._tern_version()
    assert (version.major, version.minor, version.patch) == (
        plugin["major"], plugin["minor"], plugin["patch"])
    assert version.build.decode() == plugin["build"]
    # A handle the plugin made means something only in the very copy it uses.
    handle, _ = c_api.buffer(torch.ones(4, device="tern"))

    class BufferInfo(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                    ("size", ctypes.c_uint64), ("device_address", ctypes.c_uint64),
                    ("category", ctypes.c_int), ("device", P)]

    info = BufferInfo(struct_size=ctypes.sizeof(BufferInfo))
    assert lib.tern_buffer_get_info(P(handle), ctypes.byref(info)) == 0 and info.size >= 16


def test_core_belongs_to_the_device():
    class CoreInfo(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_uint32), ("index", ctypes.c_uint32),
                    ("physical_index", ctypes.c_uint32), ("node_index", ctypes.c_uint32),
                    ("device", P)]

    info = CoreInfo(struct_size=ctypes.sizeof(CoreInfo))
    assert c_api.library().tern_core_get_info(P(c_api.core()), ctypes.byref(info)) == 0
    # Device 0 only: asking for another device's core opens it for the rest of
    # this process, and later tests run programs from C on those cores.
    assert c_api.core() == c_api.core(0) == c_api.core("tern:0")


def test_fill_through_the_current_stream_is_in_torch_order():
    t = torch.zeros(1024, device="tern")
    t.add_(2)  # queued before the fill: the fill must land after it
    _fill(c_api.queue(), t, 0, 512 * 4)
    t.mul_(3)  # queued after it: must see the ones
    expect = torch.cat([torch.full((512,), 3.0), torch.full((512,), 6.0)])
    assert torch.equal(t.cpu(), expect)


def test_views_give_the_offset_of_their_first_element():
    base = torch.zeros(16, device="tern")
    view = base[5:9]
    handle, offset = c_api.buffer(view)
    assert (handle, offset - 5 * 4) == c_api.buffer(base)
    _fill(c_api.queue(), handle, offset, view.numel() * 4)
    expect = torch.zeros(16)
    expect[5:9] = 1
    assert torch.equal(base.cpu(), expect)
    assert c_api.buffer(torch.empty(0, device="tern")) == (0, 0)


def test_read_back_with_the_c_api_on_a_side_stream():
    t = torch.arange(64, dtype=torch.float32, device="tern")
    side = torch.tern.Stream()
    assert c_api.queue(side) != c_api.queue()
    side.wait_stream(torch.tern.current_stream())
    out = (ctypes.c_float * 64)()
    handle, offset = c_api.buffer(t)
    q = c_api.queue(side)
    lib = c_api.library()
    assert lib.tern_queue_copy_d2h(P(q), out, P(handle), U64(offset), U64(64 * 4), None) == 0
    assert lib.tern_queue_synchronize(P(q), U64(2**64 - 1)) == 0
    assert list(out) == list(range(64))


def test_wrong_objects_are_refused():
    with pytest.raises(RuntimeError, match="expected a tern tensor, got one on cpu"):
        c_api.buffer(torch.ones(2))
    with pytest.raises(ValueError, match="expected a tern stream"):
        c_api.queue(torch.Stream(device="cpu"))
    with pytest.raises(Exception, match="device"):
        c_api.core(torch.tern.device_count())
