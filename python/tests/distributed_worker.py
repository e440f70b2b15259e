"""One rank of the torch.distributed tests (test_distributed.py starts two).

Run as ``python distributed_worker.py <scenario> <result-dir>`` under torchrun
or with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set. Each
rank writes ``<result-dir>/<scenario>.<rank>.json``; the test reads them.
A failed check raises, so the process exits non-zero with a traceback.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def setup(timeout_s: float = 60.0, backend=None):
    # By global rank: the same as by LOCAL_RANK on one host, and it spreads
    # the "hosts" of the two-namespace test (one rank each, both LOCAL_RANK
    # 0) over both devices of this one machine.
    torch.tern.set_device(RANK % torch.tern.device_count())
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))


def dev():
    return torch.device("tern", torch.tern.current_device())


def check_equal(name, got, want, atol=0.0):
    got_c = got.detach().cpu()
    want_c = want.detach().cpu().to(got_c.dtype)
    if not torch.allclose(got_c.double(), want_c.double(), atol=atol, rtol=0):
        raise AssertionError(f"{name}: rank {RANK} got {got_c.tolist()} expected {want_c.tolist()}")


# ---- collectives -------------------------------------------------------------


def value(rank, n, dtype):
    """Rank r's input: small integers, exact in every tested dtype."""
    return (torch.arange(n, dtype=torch.float64) % 5 + rank + 1).to(dtype)


def run_reductions(dtype, checked):
    n = 10
    inputs = [value(r, n, dtype) for r in range(WORLD)]
    stacked = torch.stack([x.double() for x in inputs])
    floating = dtype.is_floating_point
    ops = {
        "SUM": (dist.ReduceOp.SUM, stacked.sum(0)),
        "PRODUCT": (dist.ReduceOp.PRODUCT, stacked.prod(0)),
        "MIN": (dist.ReduceOp.MIN, stacked.min(0).values),
        "MAX": (dist.ReduceOp.MAX, stacked.max(0).values),
    }
    if floating:
        ops["AVG"] = (dist.ReduceOp.AVG, stacked.mean(0))
        ops["PREMUL_SUM"] = (dist._make_nccl_premul_sum(0.5), stacked.sum(0) * 0.5)
    for label, (op, want) in ops.items():
        t = inputs[RANK].to(dev())
        dist.all_reduce(t, op=op)
        check_equal(f"all_reduce {label} {dtype}", t, want)
        checked.append(f"all_reduce.{label}.{dtype}")
    # async + wait + future (DDP's comm hooks use the future)
    t = inputs[RANK].to(dev())
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    work.wait()
    (result,) = fut.wait()
    check_equal(f"all_reduce future {dtype}", result, stacked.sum(0))
    check_equal(f"all_reduce async {dtype}", t, stacked.sum(0))
    checked.append(f"all_reduce.async_future.{dtype}")
    # reduce to each root
    for root in range(WORLD):
        t = inputs[RANK].to(dev())
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        want = stacked.sum(0) if RANK == root else inputs[RANK]
        check_equal(f"reduce root {root} {dtype}", t, want)
    checked.append(f"reduce.{dtype}")
    # reduce_scatter (list) and reduce_scatter_tensor
    chunks = [value(RANK + r, n, dtype).to(dev()) for r in range(WORLD)]
    out = torch.empty(n, dtype=dtype, device=dev())
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
    want = sum(value(r + RANK, n, torch.float64) for r in range(WORLD))
    check_equal(f"reduce_scatter {dtype}", out, want)
    checked.append(f"reduce_scatter.{dtype}")
    full = torch.cat([value(RANK * 10 + r, n, dtype) for r in range(WORLD)]).to(dev())
    out = torch.empty(n, dtype=dtype, device=dev())
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM)
    want = sum(value(r * 10 + RANK, n, torch.float64) for r in range(WORLD))
    check_equal(f"reduce_scatter_tensor {dtype}", out, want)
    checked.append(f"reduce_scatter_tensor.{dtype}")
    if floating:
        out = torch.empty(n, dtype=dtype, device=dev())
        dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG)
        check_equal(f"reduce_scatter_tensor AVG {dtype}", out, want / WORLD)
        checked.append(f"reduce_scatter_tensor.AVG.{dtype}")


def run_movement(dtype, checked):
    n = 6
    mine = value(RANK, n, dtype).to(dev())
    everyone = [value(r, n, dtype) for r in range(WORLD)]
    for root in range(WORLD):
        t = mine.clone()
        dist.broadcast(t, src=root)
        check_equal(f"broadcast root {root} {dtype}", t, everyone[root])
    checked.append(f"broadcast.{dtype}")
    outs = [torch.empty(n, dtype=dtype, device=dev()) for _ in range(WORLD)]
    dist.all_gather(outs, mine)
    for r in range(WORLD):
        check_equal(f"all_gather {dtype}", outs[r], everyone[r])
    checked.append(f"all_gather.{dtype}")
    out = torch.empty(WORLD * n, dtype=dtype, device=dev())
    dist.all_gather_into_tensor(out, mine)
    check_equal(f"all_gather_into_tensor {dtype}", out, torch.cat(everyone))
    checked.append(f"all_gather_into_tensor.{dtype}")
    # even all_to_all_single: block j of rank r goes to rank j
    send = torch.cat([value(RANK * 10 + j, n, dtype) for j in range(WORLD)]).to(dev())
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    check_equal(
        f"all_to_all_single {dtype}",
        recv,
        torch.cat([value(r * 10 + RANK, n, dtype) for r in range(WORLD)]),
    )
    checked.append(f"all_to_all_single.{dtype}")
    # uneven splits: rank r sends r + j + 1 rows of width 3 to rank j
    in_splits = [RANK + j + 1 for j in range(WORLD)]
    out_splits = [r + RANK + 1 for r in range(WORLD)]
    send = torch.cat(
        [torch.full((RANK + j + 1, 3), 10.0 * RANK + j).to(dtype) for j in range(WORLD)]
    ).to(dev())
    recv = torch.empty(sum(out_splits), 3, dtype=dtype, device=dev())
    dist.all_to_all_single(recv, send, out_splits, in_splits)
    want = torch.cat([torch.full((r + RANK + 1, 3), 10.0 * r + RANK) for r in range(WORLD)])
    check_equal(f"all_to_all_single uneven {dtype}", recv, want)
    checked.append(f"all_to_all_single.uneven.{dtype}")
    outs = [torch.empty(n, dtype=dtype, device=dev()) for _ in range(WORLD)]
    dist.all_to_all(outs, [value(RANK * 10 + j, n, dtype).to(dev()) for j in range(WORLD)])
    for r in range(WORLD):
        check_equal(f"all_to_all {dtype}", outs[r], value(r * 10 + RANK, n, dtype))
    checked.append(f"all_to_all.{dtype}")
    # gather / scatter to and from each root
    for root in range(WORLD):
        gl = None
        if RANK == root:
            gl = [torch.empty(n, dtype=dtype, device=dev()) for _ in range(WORLD)]
        dist.gather(mine, gl, dst=root)
        if RANK == root:
            for r in range(WORLD):
                check_equal(f"gather {dtype}", gl[r], everyone[r])
        sl = [value(100 + r, n, dtype).to(dev()) for r in range(WORLD)] if RANK == root else None
        out = torch.empty(n, dtype=dtype, device=dev())
        dist.scatter(out, sl, src=root)
        check_equal(f"scatter {dtype}", out, value(100 + RANK, n, dtype))
    checked += [f"gather.{dtype}", f"scatter.{dtype}"]
    # send / recv (ring) and batch_isend_irecv (both directions at once)
    peer_next, peer_prev = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(mine, peer_next)
        got = torch.empty_like(mine)
        dist.recv(got, peer_prev)
    else:
        got = torch.empty_like(mine)
        dist.recv(got, peer_prev)
        dist.send(mine, peer_next)
    check_equal(f"send/recv {dtype}", got, everyone[peer_prev])
    checked.append(f"send_recv.{dtype}")
    got = torch.empty_like(mine)
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, mine, peer_next), dist.P2POp(dist.irecv, got, peer_prev)]
    )
    for req in reqs:
        req.wait()
    check_equal(f"batch_isend_irecv {dtype}", got, everyone[peer_prev])
    checked.append(f"batch_isend_irecv.{dtype}")
    # recv / irecv from any source: every other rank sends to rank 0 twice,
    # rank 0 receives with recv() and then irecv(), without naming the source.
    if RANK == 0:
        senders = []
        for _ in range(WORLD - 1):
            got = torch.empty_like(mine)
            senders.append(dist.recv(got))
            check_equal(f"recv any source {dtype}", got, everyone[senders[-1]])
            got = torch.empty_like(mine)
            work = dist.irecv(got)
            work.wait()
            senders.append(work._source_rank())
            check_equal(f"irecv any source {dtype}", got, everyone[senders[-1]])
        assert sorted(senders) == sorted(list(range(1, WORLD)) * 2), senders
    else:
        dist.send(mine, 0)
        dist.send(mine, 0)
    checked.append(f"recv_any_source.{dtype}")


def run_coalesced(checked):
    from torch.distributed.distributed_c10d import _coalescing_manager

    n = 5
    a = value(RANK, n, torch.float32).to(dev())
    b = value(RANK + 3, 2 * n, torch.float32).to(dev())
    with _coalescing_manager(device=dev()):
        dist.all_reduce(a)
        dist.all_reduce(b)
    check_equal("all_reduce coalesced a", a, sum(value(r, n, torch.float64) for r in range(WORLD)))
    want = sum(value(r + 3, 2 * n, torch.float64) for r in range(WORLD))
    check_equal("all_reduce coalesced b", b, want)
    outs = [torch.empty(WORLD * n, device=dev()), torch.empty(WORLD * 2 * n, device=dev())]
    ins = [value(RANK, n, torch.float32).to(dev()), value(RANK + 7, 2 * n, torch.float32).to(dev())]
    with _coalescing_manager(device=dev()):
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    want = torch.cat([value(r + 7, 2 * n, torch.float32) for r in range(WORLD)])
    check_equal("all_gather_into_tensor coalesced", outs[1], want)
    rs_out = [torch.empty(n, device=dev()), torch.empty(2 * n, device=dev())]
    with _coalescing_manager(device=dev()):
        for o, i in zip(rs_out, outs):
            dist.reduce_scatter_tensor(o, i)
    check_equal("reduce_scatter_tensor coalesced", rs_out[0], WORLD * value(RANK, n, torch.float32))
    # all_gather_coalesced: one output list per rank, a tensor per input in it.
    ins = [value(RANK, n, torch.float32).to(dev()), value(RANK + 5, 2 * n, torch.float32).to(dev())]
    lists = [[torch.empty(n, device=dev()), torch.empty(2 * n, device=dev())] for _ in range(WORLD)]
    dist.all_gather_coalesced(lists, ins)
    for r in range(WORLD):
        check_equal(f"all_gather_coalesced rank {r} input 0", lists[r][0],
                    value(r, n, torch.float32))
        check_equal(f"all_gather_coalesced rank {r} input 1", lists[r][1],
                    value(r + 5, 2 * n, torch.float32))
    checked += [
        "all_reduce_coalesced",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
        "all_gather_coalesced",
    ]


def thread_count():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


def resources():
    """Threads, open files and tern memory in use, once running work settled."""
    import torch_tern

    torch.tern.synchronize()
    torch.tern.empty_cache()
    deadline = time.monotonic() + 5
    last = None
    while time.monotonic() < deadline:
        now = {
            "threads": thread_count(),
            "fds": len(os.listdir("/proc/self/fd")),
            # Device memory in use, the communicators' own buffers included.
            "tern_used_bytes": torch_tern._C._tern_memory_info(torch.tern.current_device())[
                "used_bytes"
            ],
        }
        if now == last:
            break
        last = now
        time.sleep(0.2)
    return last


def scenario_collectives(out_dir):
    torch.tern.set_device(RANK % torch.tern.device_count())
    torch.ones(1, device=dev()).add_(1).cpu()  # the device and its threads are up
    # Every stream of the plugin's pool exists from now on (the communication
    # streams come from that pool), so the resource counts below are stable.
    for _ in range(8):
        with torch.tern.stream(torch.tern.Stream()):
            torch.ones(1, device=dev()).add_(1)
    # The default case: no backend given.
    dist.init_process_group(timeout=datetime.timedelta(seconds=60))
    pg = dist.group.WORLD
    tern_backend = pg._get_backend(torch.device("tern"))
    cpu_backend = pg._get_backend(torch.device("cpu"))
    assert type(tern_backend).__name__ == "_ProcessGroupTern", type(tern_backend)
    assert "Gloo" in type(cpu_backend).__name__, type(cpu_backend)
    checked = []
    c = torch.full((3,), RANK + 1.0)
    dist.all_reduce(c)
    check_equal("cpu all_reduce through gloo", c, torch.full((3,), WORLD * (WORLD + 1) / 2))
    checked.append("default.cpu_gloo")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64):
        run_reductions(dtype, checked)
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.uint8):
        run_movement(dtype, checked)
    run_coalesced(checked)
    dist.barrier()
    checked.append("barrier")
    # Empty tensors communicate nothing (and do not fail); a view reduces
    # only its own bytes.
    empty = torch.empty(0, device=dev())
    dist.all_reduce(empty)
    dist.broadcast(empty, src=0)
    dist.all_gather_into_tensor(torch.empty(0, device=dev()), empty)
    dist.reduce_scatter_tensor(torch.empty(0, device=dev()), torch.empty(0, device=dev()))
    dist.all_to_all_single(torch.empty(0, device=dev()), empty)
    torch.tern.synchronize()
    checked.append("empty_tensors")
    big = torch.zeros(10, device=dev())
    big[2:6].fill_(RANK + 1.0)
    dist.all_reduce(big[2:6])
    want = torch.zeros(10)
    want[2:6] = WORLD * (WORLD + 1) / 2
    check_equal("all_reduce of a view", big, want)
    checked.append("view")
    # torch.profiler shows each collective as "tern:<op>", as gloo's and
    # NCCL's show theirs (the range is the host's share: issued, queued).
    t = torch.ones(4, device=dev())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            dist.all_reduce(t)
        dist.broadcast(t, src=0)
    names = [e.name for e in prof.events()]
    assert names.count("tern:all_reduce") == 3, sorted(set(names))
    assert names.count("tern:broadcast") == 1, sorted(set(names))
    checked.append("profiler_ranges")
    # A collective reads what the compute stream wrote before it, also right
    # after a Work.wait() (the backend skips its wait for the compute stream
    # only when that stream was given nothing but waits for the backend's own
    # earlier collectives): a slow product keeps the compute queue busy, and
    # the value the reduction must see is written after it.
    a = torch.randn(192, 192, device=dev())
    t, u = torch.zeros(64, device=dev()), torch.zeros(64, device=dev())
    for i in range(8):
        want = torch.full((64,), WORLD * (WORLD + 1) / 2 * (i + 1))
        dist.all_reduce(t)  # then work after the wait
        slow = a @ a @ a @ a @ a @ a
        t.copy_(slow[0, :64] * 0 + (RANK + 1) * (i + 1))
        dist.all_reduce(t)
        check_equal("all_reduce after compute work", t, want)
        work = dist.all_reduce(t, async_op=True)  # work before the wait
        slow = a @ a @ a @ a @ a @ a
        u.copy_(slow[0, :64] * 0 + (RANK + 1) * (i + 1))
        work.wait()
        dist.all_reduce(u)
        check_equal("all_reduce after compute work before a wait", u, want)
    checked.append("ordered_after_compute")
    # Work.wait() makes the current stream wait; it does not block the host:
    # rank 1 joins 1.5 s late, yet rank 0's wait() returns at once, and the
    # stream (t.cpu()) gets the summed result once rank 1 arrived.
    t = torch.full((8,), RANK + 1.0, device=dev())
    if RANK == 1:
        time.sleep(1.5)
    start = time.perf_counter()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    waited = time.perf_counter() - start
    done_after_wait = work.is_completed()
    check_equal("all_reduce after a late peer", t, torch.full((8,), WORLD * (WORLD + 1) / 2))
    if RANK == 0:
        assert waited < 0.5 and not done_after_wait, (waited, done_after_wait)
        assert time.perf_counter() - start > 1.0
    checked.append("wait_does_not_block_host")
    # A synchronous collective runs on the caller's stream itself, as NCCL's
    # do: rank 1 joins late, and meanwhile rank 0's current stream holds the
    # operation while the communication stream has nothing.
    comm_stream = tern_backend._communication_stream()
    assert comm_stream is not None and comm_stream != torch.tern.current_stream()
    torch.tern.synchronize()
    t = torch.full((8,), RANK + 1.0, device=dev())
    if RANK == 1:
        time.sleep(1.0)
    dist.all_reduce(t)
    current_busy, comm_busy = not torch.tern.current_stream().query(), not comm_stream.query()
    check_equal("synchronous all_reduce", t, torch.full((8,), WORLD * (WORLD + 1) / 2))
    if RANK == 0:
        assert current_busy and not comm_busy, (current_busy, comm_busy)
    # ... and runs beside an asynchronous one of the same communicator still
    # in flight on the communication stream.
    a = torch.full((1 << 20,), RANK + 1.0, device=dev())
    work = dist.all_reduce(a, async_op=True)
    smalls = [torch.full((16,), (RANK + 1.0) * (i + 1), device=dev()) for i in range(20)]
    for small in smalls:
        dist.all_reduce(small)
    work.wait()
    check_equal("asynchronous all_reduce beside synchronous ones", a,
                torch.full((1 << 20,), WORLD * (WORLD + 1) / 2))
    for i, small in enumerate(smalls):
        check_equal("synchronous all_reduce beside an asynchronous one", small,
                    torch.full((16,), WORLD * (WORLD + 1) / 2 * (i + 1)))
    checked.append("synchronous_on_current_stream")
    description = torch_tern_describe()
    # A float64 reduction is refused with a clear error, not a wrong answer.
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.float64, device=dev()))
        raise AssertionError("float64 all_reduce did not raise")
    except RuntimeError as err:
        assert "float64" in str(err) or "Double" in str(err), err
    checked.append("float64_reduction_refused")
    # Sub-groups: every rank in one new group, and one group per rank.
    sub = dist.new_group(list(range(WORLD)))
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=sub)
    check_equal("new_group all_reduce", t, sum(value(r, 4, torch.float64) for r in range(WORLD)))
    singles = [dist.new_group([r]) for r in range(WORLD)]
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=singles[RANK])
    check_equal("single-rank group all_reduce", t, value(RANK, 4, torch.float32))
    checked.append("new_group")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tern", (WORLD,))
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=mesh.get_group())
    check_equal("device mesh all_reduce", t, sum(value(r, 4, torch.float64) for r in range(WORLD)))
    checked.append("device_mesh")
    dist.destroy_process_group()
    # destroy_process_group frees everything: after the first teardown, more
    # init / collectives / new_group / destroy cycles leave no thread, file
    # descriptor or device memory behind.
    baseline = resources()
    # (backend "tern" alone: gloo, given the same torchrun store again, can
    # read the address its previous incarnation published and fail to connect.)
    for _ in range(3):
        dist.init_process_group(backend="tern", timeout=datetime.timedelta(seconds=60))
        t = value(RANK, 4, torch.float32).to(dev())
        dist.all_reduce(t)
        sub = dist.new_group(list(range(WORLD)))
        dist.all_reduce(t, group=sub)
        want = WORLD * sum(value(r, 4, torch.float64) for r in range(WORLD))
        check_equal("re-created group all_reduce", t, want)
        del t
        dist.destroy_process_group()
    after = resources()
    checked.append("reinit_cycles")
    result = {
        "checked": checked,
        "describe": description,
        "resources_baseline": baseline,
        "resources_after": after,
    }
    with open(os.path.join(out_dir, f"collectives.{RANK}.json"), "w") as f:
        json.dump(result, f)


def scenario_cpu_tensors(out_dir):
    """A group made with backend="tern" takes CPU tensors too: each operation
    stages them through the rank's tern device (cpu_staging.h)."""
    setup(backend="tern")
    pg = dist.group.WORLD
    assert type(pg._get_backend(torch.device("cpu"))).__name__ == "_ProcessGroupTern"
    checked = []
    total = WORLD * (WORLD + 1) / 2
    # The everyday case: a CPU scalar (a loss, a count) reduced across ranks.
    loss = torch.tensor(RANK + 1.0)
    dist.all_reduce(loss)
    check_equal("cpu scalar all_reduce", loss, torch.tensor(total))
    t = value(RANK, 10, torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check_equal("cpu int64 MAX", t, value(WORLD - 1, 10, torch.int64))
    # A non-contiguous tensor (a transposed view) gets its own elements back.
    base = torch.arange(12.0).reshape(3, 4) + RANK
    view = base.t()
    dist.all_reduce(view)
    want = sum(torch.arange(12.0).reshape(3, 4) + r for r in range(WORLD))
    check_equal("cpu transposed view all_reduce", base, want)
    checked.append("all_reduce")
    # Asynchronous: complete means the CPU tensor holds the result; the
    # future carries the CPU tensors.
    t = torch.full((6,), RANK + 1.0)
    work = dist.all_reduce(t, async_op=True)
    got = work.get_future().wait()
    assert work.is_completed()
    check_equal("cpu async all_reduce", t, torch.full((6,), total))
    check_equal("cpu async future", got[0], torch.full((6,), total))
    assert got[0].device.type == "cpu", got[0].device
    checked.append("async")
    t = value(RANK, 7, torch.float64)  # moved as bytes: any dtype
    dist.broadcast(t, src=WORLD - 1)
    check_equal("cpu float64 broadcast", t, value(WORLD - 1, 7, torch.float64))
    outs = [torch.empty(3) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((3,), float(RANK)))
    for r in range(WORLD):
        check_equal("cpu all_gather", outs[r], torch.full((3,), float(r)))
    flat = torch.empty(WORLD * 2, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(flat, torch.full((2,), RANK + 1.0, dtype=torch.bfloat16))
    check_equal("cpu all_gather_into_tensor", flat, torch.arange(1.0, WORLD + 1).repeat_interleave(2))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.arange(WORLD * 2.0) + RANK)
    want = sum(torch.arange(WORLD * 2.0) + r for r in range(WORLD))[RANK * 2 : RANK * 2 + 2]
    check_equal("cpu reduce_scatter_tensor", out, want)
    sizes = [r + 1 for r in range(WORLD)]  # rank r sends r + 1 rows to every peer
    inp = torch.full((sizes[RANK] * WORLD, 2), float(RANK))
    out = torch.empty((sum(sizes), 2))
    dist.all_to_all_single(out, inp, sizes, [sizes[RANK]] * WORLD)
    want = torch.cat([torch.full((sizes[r], 2), float(r)) for r in range(WORLD)])
    check_equal("cpu all_to_all_single uneven", out, want)
    gathered = [torch.empty(2) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(torch.full((2,), RANK * 10.0), gathered, dst=0)
    if RANK == 0:
        for r in range(WORLD):
            check_equal("cpu gather", gathered[r], torch.full((2,), r * 10.0))
    out = torch.empty(2)
    pieces = [torch.full((2,), r * 3.0) for r in range(WORLD)] if RANK == 0 else None
    dist.scatter(out, pieces, src=0)
    check_equal("cpu scatter", out, torch.full((2,), RANK * 3.0))
    checked.append("movement")
    # Point to point stays asynchronous: rank 1's irecv returns at once
    # although rank 0 sends a second later, and completes with the data.
    # (Ordered as with NCCL: one rank sends first, its peer receives first.)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(4)
    mine = torch.full((4,), float(RANK))
    if RANK % 2 == 0:
        time.sleep(1.0)
        send_work = dist.isend(mine, dst=nxt)
        recv_work = dist.irecv(got, src=prv)
    else:
        start = time.perf_counter()
        recv_work = dist.irecv(got, src=prv)
        posted = time.perf_counter() - start
        assert posted < 0.5, f"irecv of a CPU tensor blocked the caller for {posted:.2f} s"
        send_work = dist.isend(mine, dst=nxt)
    send_work.wait()
    recv_work.wait()
    assert recv_work.is_completed()
    check_equal("cpu irecv", got, torch.full((4,), float(prv)))
    got = torch.empty(3)
    works = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.full((3,), RANK + 0.5), nxt),
            dist.P2POp(dist.irecv, got, prv),
        ]
    )
    for w in works:
        w.wait()
    check_equal("cpu batch_isend_irecv", got, torch.full((3,), prv + 0.5))
    checked.append("p2p")
    dist.barrier()
    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": RANK})
    assert objects == [{"rank": r} for r in range(WORLD)], objects
    checked.append("objects_and_barrier")
    # A CPU model under DDP on the tern group: its gradient buckets are
    # reduced through the device, and every rank ends with the same weights.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(100 * RANK + step))
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
    weights = [torch.empty_like(model.weight) for _ in range(WORLD)]
    dist.all_gather(weights, model.weight.detach())
    for r in range(WORLD):
        check_equal("cpu DDP weights agree", weights[r], weights[0])
    checked.append("ddp")
    try:
        dist.all_reduce(torch.ones(2, 2).to_sparse())
        raise AssertionError("a sparse CPU tensor did not raise")
    except RuntimeError as err:
        assert "sparse" in str(err), err
    checked.append("sparse_refused")
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"cpu_tensors.{RANK}.json"), "w") as f:
        json.dump({"checked": checked}, f)


def torch_tern_describe():
    import torch_tern.distributed

    return torch_tern.distributed.describe()


# ---- sub-groups by communicator split -------------------------------------------


def scenario_split(out_dir):
    """Sub-groups split from the default group's communicator (tern_comm_split)."""
    import torch_tern
    import torch_tern.distributed as td
    from torch.distributed.device_mesh import init_device_mesh

    counts = torch_tern._C._distributed_comm_counts
    torch.tern.set_device(RANK % torch.tern.device_count())
    torch.ones(1, device=dev()).add_(1).cpu()
    start = counts()
    # Bound to a device: torch connects the group at once (eager) and splits.
    dist.init_process_group(
        backend="cpu:gloo,tern:tern",
        timeout=datetime.timedelta(seconds=60),
        device_id=dev(),
    )
    world = dist.group.WORLD
    tern_world = world._get_backend(torch.device("tern"))
    assert tern_world.supports_splitting
    assert td.comm_origin() == "store", td.comm_origin()  # connected by init_process_group
    assert counts()["store"] == start["store"] + 1, (start, counts())
    checked = []

    def total(ranks):
        return sum(value(r, 4, torch.float64) for r in ranks)

    # split_group: one group per rank.
    singles = dist.split_group(split_ranks=[[r] for r in range(WORLD)])
    assert singles is not None and singles.size() == 1 and singles.rank() == 0
    assert td.comm_origin(singles) == "split", td.comm_origin(singles)
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=singles)
    check_equal("split_group single all_reduce", t, value(RANK, 4, torch.float32))
    checked.append("split_group.singles")
    # split_group: two halves (ranks in reverse order: torch sorts them).
    half = WORLD // 2
    halves = [list(range(half - 1, -1, -1)), list(range(WORLD - 1, half - 1, -1))]
    mine = sorted(halves[0] if RANK < half else halves[1])
    group = dist.split_group(split_ranks=halves)
    assert group.size() == half and group.rank() == mine.index(RANK), (group.rank(), mine)
    assert td.comm_origin(group) == "split"
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=group)
    check_equal("split_group halves all_reduce", t, total(mine))
    # The cpu side of the group was split as well (gloo, through the store).
    c = torch.full((2,), RANK + 1.0)
    dist.all_reduce(c, group=group)
    want = torch.full((2,), sum(r + 1.0 for r in mine))
    check_equal("split_group halves cpu all_reduce", c, want)
    checked.append("split_group.halves")
    # A split of a split: the half into single ranks (ranks of the half).
    quarter = dist.split_group(parent_pg=group, split_ranks=[[r] for r in range(half)])
    assert quarter.size() == 1 and td.comm_origin(quarter) == "split"
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t, group=quarter)
    check_equal("split of a split all_reduce", t, value(RANK, 4, torch.float32))
    checked.append("split_group.nested")
    # DeviceMesh: with a bound device torch builds each dimension by split_group.
    # Before the groups below that leave ranks out: split_group names a group
    # by its ranks and the number of groups the calling rank is in, and gloo
    # (the cpu side) rendezvouses under that name, so once ranks belong to
    # different numbers of groups, gloo's side of a later split never meets
    # (torch 2.13; tern's side does not use the store).
    if WORLD >= 4:
        mesh = init_device_mesh("tern", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            g = mesh.get_group(dim)
            assert td.comm_origin(g) == "split", (dim, td.comm_origin(g))
            ranks = dist.get_process_group_ranks(g)
            t = value(RANK, 4, torch.float32).to(dev())
            dist.all_reduce(t, group=g)
            check_equal(f"mesh {dim} all_reduce", t, total(ranks))
    else:
        mesh = init_device_mesh("tern", (WORLD,))
        t = value(RANK, 4, torch.float32).to(dev())
        dist.all_reduce(t, group=mesh.get_group())
        check_equal("mesh all_reduce", t, total(range(WORLD)))
    checked.append("device_mesh")
    # split_group: rank 0 alone; the others are in no group and get None.
    only_first = dist.split_group(split_ranks=[[0]])
    if RANK == 0:
        assert only_first is not None and only_first.size() == 1
    else:
        assert only_first is None, only_first
    checked.append("split_group.non_member")
    # new_group: split as well, the non-members entering the split from torch.
    before = counts()["split"]
    evens = list(range(0, WORLD, 2))
    sub = dist.new_group(evens)
    if RANK in evens:
        assert td.comm_origin(sub) == "split", td.comm_origin(sub)
        t = value(RANK, 4, torch.float32).to(dev())
        dist.all_reduce(t, group=sub)
        check_equal("new_group all_reduce", t, total(evens))
        assert counts()["split"] == before + 1, (before, counts())
    else:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER, sub
        assert counts()["split"] == before, (before, counts())
    # Unsorted ranks: the group's rank follows the list.
    backwards = dist.new_group(list(range(WORLD - 1, -1, -1)), sort_ranks=False)
    assert backwards.rank() == WORLD - 1 - RANK, backwards.rank()
    assert td.comm_origin(backwards) == "split"
    t = torch.zeros(WORLD, device=dev())
    dist.all_gather_into_tensor(t, torch.full((1,), float(RANK), device=dev()), group=backwards)
    check_equal("unsorted new_group all_gather", t, torch.arange(WORLD - 1, -1, -1))
    checked.append("new_group")
    # The parent still works after all that.
    t = value(RANK, 4, torch.float32).to(dev())
    dist.all_reduce(t)
    check_equal("world all_reduce after splits", t, total(range(WORLD)))
    used = counts()
    torch.tern.synchronize()
    dist.destroy_process_group()
    result = {
        "checked": checked,
        "counts_start": start,
        "counts_used": used,
        "counts_end": counts(),
        "parent_split_count": tern_world.comm_split_count(),
    }
    with open(os.path.join(out_dir, f"split.{RANK}.json"), "w") as f:
        json.dump(result, f)


# ---- DDP -----------------------------------------------------------------------


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 4),
    )


def make_data(steps, batch):
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, batch, 16, generator=g)
    teacher = torch.randn(16, 4, generator=g)
    ys = torch.tanh(xs @ teacher)  # learnable: the loss must go down
    return xs, ys


def train_whole(model, xs, ys, steps, lr):
    """The single-process reference: SGD on every step's whole batch. The
    losses, one per step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs[s].to(dev())), ys[s].to(dev()))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_shares(model, xs, ys, steps, lr):
    """SGD of a distributed model (DDP, FSDP2, HSDP) where each rank takes its
    share of every step's batch. The losses, averaged over the ranks."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    share = xs.shape[1] // WORLD
    losses = []
    for s in range(steps):
        opt.zero_grad()
        x = xs[s, RANK * share : (RANK + 1) * share].to(dev())
        y = ys[s, RANK * share : (RANK + 1) * share].to(dev())
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses


def scenario_training(out_dir):
    """DDP and FSDP2 (fully_shard) on 2 ranks against a single-process run."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, batch = 50, 8
    setup(backend="tern")
    xs, ys = make_data(steps, batch)
    # The single-process reference, on this rank's device: the whole batch.
    ref = make_model().to(dev())
    ref_losses = train_whole(ref, xs, ys, steps, lr=0.05)
    # DDP: each rank takes its share of every batch.
    model = DDP(make_model().to(dev()))
    share = batch // WORLD
    start = time.perf_counter()
    losses = train_shares(model, xs, ys, steps, lr=0.05)
    elapsed = time.perf_counter() - start
    result = {
        "describe": torch_tern_describe(),
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "param_diff": max(
            (p.detach().cpu() - q.detach().cpu()).abs().max().item()
            for p, q in zip(model.module.parameters(), ref.parameters())
        ),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "ddp_seconds": elapsed,
        "steps": steps,
    }
    # DDP's runtime statistics (sampled in the first iterations), in device
    # nanoseconds: tern's c10d Timer (csrc/distributed/ddp_timer.cc).
    logged = model._get_ddp_logging_data()
    result["ddp_runtime_ns"] = {
        k: logged.get(k, 0)
        for k in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time")
    }
    # DDP with a Python comm hook (torch's allreduce_hook: dist.all_reduce
    # async, then get_future().then(...)), small buckets so several overlap.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hooked = DDP(make_model().to(dev()), bucket_cap_mb=0.001)
    hooked.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(hooked.parameters(), lr=0.05)
    for s in range(steps):
        opt.zero_grad()
        x = xs[s, RANK * share : (RANK + 1) * share].to(dev())
        y = ys[s, RANK * share : (RANK + 1) * share].to(dev())
        torch.nn.functional.mse_loss(hooked(x), y).backward()
        opt.step()
    result["hook_param_diff"] = max(
        (p.detach().cpu() - q.detach().cpu()).abs().max().item()
        for p, q in zip(hooked.module.parameters(), ref.parameters())
    )
    # FSDP2: every Linear sharded, then the root (all_gather_into_tensor and
    # reduce_scatter_tensor on tern streams), on the same data.
    from torch.distributed.fsdp import fully_shard

    import torch_tern

    sharded = make_model().to(dev())
    for layer in sharded:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    torch_tern.clear_op_tracking()
    fsdp_losses = train_shares(sharded, xs, ys, steps, lr=0.05)
    result["fsdp_fallback_ops"] = sorted(torch_tern.get_fallback_ops())
    result["fsdp_loss_diff"] = max(abs(a - b) for a, b in zip(fsdp_losses, ref_losses))
    result["fsdp_param_diff"] = max(
        (p.full_tensor().cpu() - q.detach().cpu()).abs().max().item()
        for p, q in zip(sharded.parameters(), ref.parameters())
    )
    result["fsdp_last_loss"] = fsdp_losses[-1]
    if WORLD >= 4 and WORLD % 2 == 0:
        # HSDP: a 2-D mesh, replicated over 2 groups, sharded within each.
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("tern", (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
        hybrid = make_model().to(dev())
        for layer in hybrid:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(hybrid, mesh=mesh)
        hsdp_losses = train_shares(hybrid, xs, ys, steps, lr=0.05)
        result["hsdp_loss_diff"] = max(abs(a - b) for a, b in zip(hsdp_losses, ref_losses))
        result["hsdp_param_diff"] = max(
            (p.full_tensor().cpu() - q.detach().cpu()).abs().max().item()
            for p, q in zip(hybrid.parameters(), ref.parameters())
        )
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"training.{RANK}.json"), "w") as f:
        json.dump(result, f)


def make_bn_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
    )


def scenario_sync_batch_norm(out_dir):
    """SyncBatchNorm under DDP against one process's BatchNorm on the whole
    batch: the statistics are the whole batch's on every rank, so losses,
    parameters and running statistics match; then ranks with batches of
    different sizes (the per-rank counts) against the whole batch."""
    import torch_tern
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, batch = 10, 8
    setup(backend="tern")
    g = torch.Generator().manual_seed(3)
    # One batch, seen every step: the loss must go down.
    xs = torch.randn(1, batch, 3, 6, 6, generator=g).expand(steps, -1, -1, -1, -1)
    ys = torch.randn(1, batch, 4, generator=g).expand(steps, -1, -1)
    ref = make_bn_model().to(dev())
    ref_losses = train_whole(ref, xs, ys, steps, lr=0.1)
    model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(make_bn_model()).to(dev()))
    torch_tern.clear_op_tracking()
    losses = train_shares(model, xs, ys, steps, lr=0.1)
    result = {"fallback_ops": sorted(torch_tern.get_fallback_ops())}
    result["loss_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
    result["param_diff"] = max(
        (p.detach().cpu() - q.detach().cpu()).abs().max().item()
        for p, q in zip(model.module.parameters(), ref.parameters())
    )
    result["buffer_diff"] = max(
        (p.cpu().double() - q.cpu().double()).abs().max().item()
        for p, q in zip(model.module.buffers(), ref.buffers())
    )
    result["first_loss"], result["last_loss"] = losses[0], losses[-1]
    # Unequal shares: rank r takes r + 1 rows (no DDP: a forward in training
    # mode, which updates the running statistics from every rank's rows).
    rows = [r + 1 for r in range(WORLD)]
    x = torch.randn(sum(rows), 8, 5, 5, generator=g)
    bn = torch.nn.BatchNorm2d(8).to(dev())
    sync = torch.nn.SyncBatchNorm(8).to(dev())
    want = bn(x.to(dev()))
    begin = sum(rows[:RANK])
    got = sync(x[begin : begin + rows[RANK]].to(dev()))
    mine = want[begin : begin + rows[RANK]]
    result["uneven_out_diff"] = (got.cpu() - mine.cpu()).abs().max().item()
    result["uneven_stats_diff"] = max(
        (sync.running_mean.cpu() - bn.running_mean.cpu()).abs().max().item(),
        (sync.running_var.cpu() - bn.running_var.cpu()).abs().max().item(),
    )
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"sync_batch_norm.{RANK}.json"), "w") as f:
        json.dump(result, f)


# ---- faults --------------------------------------------------------------------


def scenario_kill(out_dir):
    timeout = 20.0
    setup(timeout_s=timeout, backend="tern")
    t = torch.ones(1024, device=dev())
    dist.all_reduce(t)
    t.cpu()
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies before its part of the next step
    start = time.perf_counter()
    error = None
    try:
        dist.all_reduce(t)
        t.cpu()
    except Exception as err:  # noqa: BLE001 - the test checks the message
        error = f"{type(err).__name__}: {err}"
    elapsed = time.perf_counter() - start
    # Tearing down a group whose peer died must not wait for that peer.
    start = time.perf_counter()
    dist.destroy_process_group()
    destroy_seconds = time.perf_counter() - start
    with open(os.path.join(out_dir, f"kill.{RANK}.json"), "w") as f:
        json.dump(
            {
                "error": error,
                "seconds": elapsed,
                "timeout": timeout,
                "destroy_seconds": destroy_seconds,
            },
            f,
        )


def scenario_mismatch(out_dir):
    timeout = 20.0
    setup(timeout_s=timeout, backend="tern")
    t = torch.ones(64, device=dev())
    dist.all_reduce(t)
    t.cpu()
    start = time.perf_counter()
    error = None
    try:
        if RANK == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
        t.cpu()
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    dist.destroy_process_group()
    destroy_seconds = time.perf_counter() - start
    with open(os.path.join(out_dir, f"mismatch.{RANK}.json"), "w") as f:
        json.dump(
            {
                "error": error,
                "seconds": elapsed,
                "timeout": timeout,
                "destroy_seconds": destroy_seconds,
            },
            f,
        )


def scenario_stall(out_dir):
    """Rank 1 stays alive but joins an all_reduce only after the group's timeout."""
    timeout = 2.0
    setup(timeout_s=timeout, backend="tern")
    t = torch.ones(64, device=dev())
    dist.all_reduce(t)
    t.cpu()
    start = time.perf_counter()
    error = None
    if RANK == 1:
        time.sleep(1.5 * timeout)
    try:
        dist.all_reduce(t)
        t.cpu()
    except Exception as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    elapsed = time.perf_counter() - start
    with open(os.path.join(out_dir, f"stall.{RANK}.json"), "w") as f:
        json.dump({"error": error, "seconds": elapsed, "timeout": timeout}, f)
    os._exit(0)  # both ranks saw the group fail


def scenario_abort(out_dir):
    """Rank 0 aborts the group while rank 1 waits in an all_reduce."""
    timeout = 20.0
    setup(timeout_s=timeout, backend="tern")
    t = torch.ones(64, device=dev())
    dist.all_reduce(t)
    t.cpu()
    dist.barrier()
    error = None
    start = time.perf_counter()
    if RANK == 0:
        time.sleep(0.5)  # rank 1 is inside its all_reduce by now
        dist.distributed_c10d._abort_process_group()
        try:
            dist.all_reduce(t)  # the group is gone
        except Exception as err:  # noqa: BLE001
            error = f"{type(err).__name__}: {err}"
    else:
        try:
            dist.all_reduce(t)
            t.cpu()
        except Exception as err:  # noqa: BLE001
            error = f"{type(err).__name__}: {err}"
    elapsed = time.perf_counter() - start
    with open(os.path.join(out_dir, f"abort.{RANK}.json"), "w") as f:
        json.dump({"error": error, "seconds": elapsed, "timeout": timeout}, f)
    os._exit(0)


if __name__ == "__main__":
    scenario, out = sys.argv[1], sys.argv[2]
    globals()[f"scenario_{scenario}"](out)
