"""The caching allocator: statistics, reuse, empty_cache, out of memory, pinned memory."""

import gc

import pytest
import torch

GiB = 1 << 30


@pytest.fixture(autouse=True)
def clean_allocator():
    # Tensors an earlier test left in reference cycles (a raised exception's
    # traceback keeps its frames' tensors) hold their blocks until collected.
    gc.collect()
    torch.tern.synchronize()
    torch.tern.empty_cache()
    torch.tern.reset_peak_memory_stats()
    yield
    torch.tern.empty_cache()


def test_allocated_and_reserved():
    base = torch.tern.memory_allocated()
    t = torch.empty(1000, device="tern")  # 4000 bytes -> a 4096-byte block
    assert torch.tern.memory_allocated() == base + 4096
    assert torch.tern.memory_reserved() >= torch.tern.memory_allocated()
    stats = torch.tern.memory_stats()
    assert stats["requested_bytes.all.current"] >= 4000
    assert stats["allocation.all.current"] >= 1
    del t
    assert torch.tern.memory_allocated() == base
    assert torch.tern.memory_reserved() >= 4096  # cached, not returned


def test_block_reuse_by_size_class():
    torch.tern.reset_accumulated_memory_stats()
    a = torch.empty(1000, device="tern")
    ptr = a.data_ptr()
    del a
    b = torch.empty(1010, device="tern")  # same 4096-byte class
    assert b.data_ptr() == ptr
    assert torch.tern.memory_stats()["num_device_alloc"] == 1
    c = torch.empty(5000, device="tern")  # another class: a new block
    assert c.data_ptr() != ptr
    assert torch.tern.memory_stats()["num_device_alloc"] == 2


def test_empty_cache_returns_memory():
    t = torch.empty(10 << 20, dtype=torch.uint8, device="tern")
    used = torch.tern.mem_get_info()[0]
    del t
    assert torch.tern.memory_reserved() >= 10 << 20
    torch.tern.empty_cache()
    assert torch.tern.memory_reserved() == 0
    assert torch.tern.mem_get_info()[0] >= used + (10 << 20)


def test_peak_statistics():
    a = torch.empty(1 << 20, dtype=torch.uint8, device="tern")
    b = torch.empty(1 << 20, dtype=torch.uint8, device="tern")
    peak = torch.tern.max_memory_allocated()
    assert peak >= 2 << 20
    del a, b
    assert torch.tern.max_memory_allocated() == peak
    torch.tern.reset_peak_memory_stats()
    assert torch.tern.max_memory_allocated() == torch.tern.memory_allocated()
    assert torch.tern.max_memory_reserved() >= torch.tern.memory_reserved()


def test_per_device_statistics():
    base1 = torch.tern.memory_allocated(1)
    t = torch.empty(100, device="tern:1")
    assert torch.tern.memory_allocated(1) == base1 + 512
    assert torch.tern.memory_allocated("tern:1") == base1 + 512
    del t


def test_out_of_memory_raises_with_tern_message():
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(3 * GiB, dtype=torch.uint8, device="tern")
    message = str(info.value)
    assert "tern out of memory on device tern:0" in message
    assert "tried to allocate 3.00 GiB" in message
    assert "TERN_ERROR_OUT_OF_MEMORY" in message  # tern's own breakdown follows
    assert torch.tern.memory_stats()["num_ooms"] >= 1
    # The device stays usable.
    x = torch.ones(10, device="tern")
    assert x.sum().item() == 10


def test_out_of_memory_releases_cache_and_retries():
    torch.tern.reset_accumulated_memory_stats()
    a = torch.empty(int(1.2 * GiB), dtype=torch.uint8, device="tern")
    del a  # cached: 1.2 GiB still reserved from tern
    assert torch.tern.memory_reserved() >= int(1.2 * GiB)
    b = torch.empty(int(1.5 * GiB), dtype=torch.uint8, device="tern")  # needs the cache back
    stats = torch.tern.memory_stats()
    assert stats["num_alloc_retries"] == 1
    assert stats["num_ooms"] == 0
    assert torch.tern.memory_reserved() < int(2.8 * GiB)
    del b


def test_pinned_memory():
    host = torch.arange(1000, dtype=torch.float32)
    assert not host.is_pinned()
    pinned = host.pin_memory()
    assert pinned.is_pinned()
    assert torch.equal(pinned, host)
    dev = pinned.to("tern", non_blocking=True)
    back = torch.empty(1000, pin_memory=True)
    assert back.is_pinned()
    back.copy_(dev, non_blocking=True)
    torch.tern.synchronize()
    assert torch.equal(back, host)
    stats = torch._C._accelerator_getAccelerator()  # noqa: F841  (accelerator is tern)
    import torch_tern
    assert torch_tern._C._host_memory_stats()["allocated_bytes.current"] >= 8192
