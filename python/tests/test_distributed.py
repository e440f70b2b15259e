"""torch.distributed on tern: two real processes per test (no mocks).

Each test starts two ranks of distributed_worker.py, under torchrun where
torchrun fits, and with plain subprocesses where a rank must die or fail on
its own (torchrun would stop the survivor itself). Every launch has a
timeout, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("distributed_worker.py")
LAUNCH_TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch was built without torch.distributed"
)


def _env():
    env = dict(os.environ)
    # Two processes share this machine's few cores: one compute thread each.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TORCH_TERN_CORE", None)
    return env


def _need_free_cores(n: int) -> None:
    """Each rank owns one tern core; skip when the node has fewer free."""
    import torch_tern

    free = torch_tern._C._distributed_free_cores()
    if free < n:
        pytest.skip(
            f"{n} ranks need {n} free tern cores, the node has {free} "
            "(other processes own the rest)"
        )


NPROCS = [2, 4]


def _torchrun(scenario: str, out: Path, nproc: int = 2) -> subprocess.CompletedProcess:
    _need_free_cores(nproc)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        scenario,
        str(out),
    ]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, (
        f"torchrun {scenario} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_two(scenario: str, out: Path) -> list[subprocess.Popen]:
    """Two ranks as plain processes (env:// rendezvous), no supervising agent."""
    _need_free_cores(2)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = _env()
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def _wait_all(procs, timeout=LAUNCH_TIMEOUT_S):
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return outputs


def _result(out: Path, scenario: str, rank: int) -> dict:
    return json.loads((out / f"{scenario}.{rank}.json").read_text())


@pytest.mark.parametrize("nproc", NPROCS)
def test_distributed_collectives_default_backend(tmp_path, nproc):
    """Every collective, several dtypes, sub-groups, a mesh, teardown."""
    _torchrun("collectives", tmp_path, nproc)
    for rank in range(nproc):
        r = _result(tmp_path, "collectives", rank)
        checked = set(r["checked"])
        for name in (
            "default.cpu_gloo",
            "all_reduce.SUM.torch.float32",
            "all_reduce.PREMUL_SUM.torch.float32",
            "all_reduce.MIN.torch.float16",
            "all_reduce.MAX.torch.int32",
            "all_reduce.AVG.torch.bfloat16",
            "all_reduce.PRODUCT.torch.int64",
            "all_reduce.async_future.torch.float32",
            "reduce.torch.float16",
            "reduce_scatter.torch.int32",
            "reduce_scatter_tensor.AVG.torch.float32",
            "broadcast.torch.float64",
            "all_gather.torch.uint8",
            "all_gather_into_tensor.torch.bfloat16",
            "all_to_all_single.uneven.torch.float32",
            "all_to_all.torch.int64",
            "gather.torch.float32",
            "scatter.torch.float32",
            "send_recv.torch.float32",
            "batch_isend_irecv.torch.float32",
            "recv_any_source.torch.float32",
            "all_reduce_coalesced",
            "all_gather_into_tensor_coalesced",
            "reduce_scatter_tensor_coalesced",
            "all_gather_coalesced",
            "barrier",
            "wait_does_not_block_host",
            "synchronous_on_current_stream",
            "empty_tensors",
            "view",
            "ordered_after_compute",
            "profiler_ranges",
            "float64_reduction_refused",
            "new_group",
            "device_mesh",
        ):
            assert name in checked, f"rank {rank} did not check {name}"
        assert r["describe"].startswith(f"rank {rank}/{nproc} on tern:"), r["describe"]
        # Init / destroy cycles after the first leave nothing behind.
        assert "reinit_cycles" in checked
        for what in ("threads", "fds", "tern_used_bytes"):
            assert r["resources_after"][what] <= r["resources_baseline"][what], (what, r)


def test_distributed_cpu_tensors_in_a_tern_group(tmp_path):
    """backend="tern" also takes CPU tensors (staged through the device): every
    collective, point to point that does not block the caller, objects,
    barrier, DDP of a CPU model; a sparse tensor is a clear error."""
    _torchrun("cpu_tensors", tmp_path, 2)
    for rank in range(2):
        checked = _result(tmp_path, "cpu_tensors", rank)["checked"]
        assert checked == [
            "all_reduce",
            "async",
            "movement",
            "p2p",
            "objects_and_barrier",
            "ddp",
            "sparse_refused",
        ], checked


@pytest.mark.parametrize("nproc", NPROCS)
def test_distributed_subgroups_split_the_parent_communicator(tmp_path, nproc):
    """split_group, new_group and DeviceMesh once the default group is bound to a
    device: every sub-group's communicator comes from tern_comm_split, and
    destroy_process_group frees them all."""
    _torchrun("split", tmp_path, nproc)
    for rank in range(nproc):
        r = _result(tmp_path, "split", rank)
        for name in (
            "split_group.singles",
            "split_group.halves",
            "split_group.nested",
            "split_group.non_member",
            "new_group",
            "device_mesh",
        ):
            assert name in r["checked"], f"rank {rank} did not check {name}"
        start, used, end = r["counts_start"], r["counts_used"], r["counts_end"]
        # Only the default group rendezvoused through the store; the rest were splits.
        assert used["store"] - start["store"] == 1, r
        mesh_groups = 2 if nproc >= 4 else 0  # a 1-D mesh of every rank is the default group
        # singles, halves, rank 0 alone, the even ranks, all ranks backwards
        member_of = 1 + 1 + (1 if rank == 0 else 0) + (1 if rank % 2 == 0 else 0) + 1
        nested = 1  # a half split again
        assert used["split"] - start["split"] == member_of + nested + mesh_groups, r
        assert used["live"] - start["live"] == 1 + member_of + nested + mesh_groups, r
        # Every rank entered every split of the default group, member or not.
        assert r["parent_split_count"] == 5 + mesh_groups, r
        assert end["live"] == start["live"], r  # destroy_process_group freed them all


@pytest.mark.parametrize("nproc", NPROCS)
def test_distributed_ddp_and_fsdp2_match_single_process(tmp_path, nproc):
    _torchrun("training", tmp_path, nproc)
    for rank in range(nproc):
        r = _result(tmp_path, "training", rank)
        assert r["steps"] == 50
        assert r["last_loss"] < 0.8 * r["first_loss"], r  # it learns
        assert r["loss_diff"] <= 1e-5, r
        assert r["param_diff"] <= 1e-5, r
        assert r["hook_param_diff"] <= 1e-5, r  # DDP with a Python comm hook (futures)
        # DDP's runtime statistics come from tern events (0 with host clocks).
        assert min(r["ddp_runtime_ns"].values()) >= 1, r["ddp_runtime_ns"]
        assert r["fsdp_loss_diff"] <= 1e-5, r
        assert r["fsdp_param_diff"] <= 1e-5, r
        assert r["fsdp_fallback_ops"] == [], r  # every op FSDP2 runs is native on tern
        if nproc == 4:  # HSDP on a 2 x 2 mesh (replicate x shard)
            assert r["hsdp_loss_diff"] <= 1e-5, r
            assert r["hsdp_param_diff"] <= 1e-5, r


@pytest.mark.parametrize("nproc", NPROCS)
def test_distributed_sync_batch_norm_matches_single_process(tmp_path, nproc):
    """torch.nn.SyncBatchNorm runs natively on tern (its five batch_norm_*
    operators have no CPU kernel in PyTorch, so a fallback could not run them)."""
    _torchrun("sync_batch_norm", tmp_path, nproc)
    for rank in range(nproc):
        r = _result(tmp_path, "sync_batch_norm", rank)
        assert r["last_loss"] < r["first_loss"], r  # it learns
        assert r["loss_diff"] <= 1e-5, r
        assert r["param_diff"] <= 1e-5, r
        assert r["buffer_diff"] <= 1e-5, r  # running statistics (and batches tracked)
        assert r["uneven_out_diff"] <= 1e-5, r
        assert r["uneven_stats_diff"] <= 1e-5, r
        # SyncBatchNorm drops empty ranks' statistics with a boolean mask
        # (count_all[mask]): PyTorch runs that as nonzero + index, whose
        # output size depends on the data; tern runs both on the CPU.
        assert set(r["fallback_ops"]) <= {"aten::nonzero", "aten::index.Tensor_out"}, r


def test_distributed_killed_rank_is_an_error_naming_it(tmp_path):
    procs = _spawn_two("kill", tmp_path)
    outputs = _wait_all(procs)
    assert procs[1].returncode == -9, outputs[1]
    assert procs[0].returncode == 0, outputs[0]
    r = _result(tmp_path, "kill", 0)
    assert r["error"] is not None, f"rank 0 saw no error after rank 1 died: {r}\n{outputs[0]}"
    assert "rank 1" in r["error"], r["error"]
    assert r["seconds"] < r["timeout"] + 5, r
    assert r["destroy_seconds"] < 5, r  # teardown does not wait for the dead rank


def test_distributed_mismatched_collectives_are_an_error(tmp_path):
    procs = _spawn_two("mismatch", tmp_path)
    outputs = _wait_all(procs)
    for rank in range(2):
        assert procs[rank].returncode == 0, outputs[rank]
        r = _result(tmp_path, "mismatch", rank)
        assert r["error"] is not None, f"rank {rank} saw no error: {r}\n{outputs[rank]}"
        assert "mismatch" in r["error"].lower(), r["error"]
        assert r["seconds"] < r["timeout"] + 5, r
        assert r["destroy_seconds"] < 5, r


def test_distributed_abort_fails_the_peers_operation(tmp_path):
    procs = _spawn_two("abort", tmp_path)
    outputs = _wait_all(procs)
    for rank in range(2):
        assert procs[rank].returncode == 0, outputs[rank]
    waiting = _result(tmp_path, "abort", 1)
    assert waiting["error"] is not None, f"rank 1 saw no error: {waiting}\n{outputs[1]}"
    assert "abort" in waiting["error"].lower() and "rank 0" in waiting["error"], waiting["error"]
    assert waiting["seconds"] < waiting["timeout"], waiting
    aborting = _result(tmp_path, "abort", 0)
    assert aborting["error"] is not None, aborting  # no group left to run on


def test_distributed_stalled_rank_times_out_naming_it(tmp_path):
    """A live rank that never joins: the other raises after the group's timeout."""
    procs = _spawn_two("stall", tmp_path)
    outputs = _wait_all(procs)
    for rank in range(2):
        assert procs[rank].returncode == 0, outputs[rank]
    r = _result(tmp_path, "stall", 0)
    assert r["error"] is not None, f"rank 0 saw no error: {r}\n{outputs[0]}"
    assert "did not complete within" in r["error"] and "rank 1" in r["error"], r["error"]
    assert r["timeout"] - 0.5 <= r["seconds"] < r["timeout"] + 5, r
    late = _result(tmp_path, "stall", 1)
    assert late["error"] is not None and "broken by an earlier failure" in late["error"], late


def _run_quiet(*cmd) -> bool:
    return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


def test_distributed_two_hosts_over_libfabric_tcp(tmp_path):
    """Two "hosts": two network namespaces joined by a veth pair, one torchrun
    each with a c10d rendezvous endpoint; tern's collectives cross over
    libfabric (tcp), since ranks in different network namespaces are on
    different nodes to tern. DDP and FSDP2 must still match one process."""
    tag = f"{os.getpid() % 100000}"
    ns = [f"ternt{tag}a", f"ternt{tag}b"]
    veth = [f"tva{tag}", f"tvb{tag}"]
    addr = ["10.77.13.1", "10.77.13.2"]
    if os.geteuid() != 0 or not _run_quiet("ip", "netns", "add", ns[0]):
        pytest.skip("cannot create network namespaces here (needs root / CAP_NET_ADMIN and ip)")
    _need_free_cores(2)
    try:
        steps = [
            ("ip", "netns", "add", ns[1]),
            ("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
        ]
        for i in range(2):
            steps += [
                ("ip", "link", "set", veth[i], "netns", ns[i]),
                ("ip", "-n", ns[i], "addr", "add", f"{addr[i]}/24", "dev", veth[i]),
                ("ip", "-n", ns[i], "link", "set", "lo", "up"),
                ("ip", "-n", ns[i], "link", "set", veth[i], "up"),
            ]
        for step in steps:
            if not _run_quiet(*step):
                pytest.skip(f"cannot set up the namespaces: {' '.join(step)} failed")
        port = 29000 + os.getpid() % 1000
        procs = []
        for i in range(2):
            cmd = [
                "ip", "netns", "exec", ns[i],
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={addr[0]}:{port}", f"--rdzv-id=t{tag}",
                # The namespaces cannot resolve this machine's hostname: say
                # which node hosts the rendezvous store and which address is whose.
                f"--rdzv-conf=is_host={'true' if i == 0 else 'false'}",
                f"--local-addr={addr[i]}",
                str(WORKER), "training", str(tmp_path),
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        outputs = _wait_all(procs)
        for i in range(2):
            assert procs[i].returncode == 0, outputs[i][-6000:]
    finally:
        for name in ns:
            _run_quiet("ip", "netns", "del", name)  # also removes the veth pair
    for rank in range(2):
        r = _result(tmp_path, "training", rank)
        assert "tcp" in r["describe"], r["describe"]  # libfabric, not shared memory
        assert r["loss_diff"] <= 1e-5 and r["param_diff"] <= 1e-5, r
        assert r["fsdp_loss_diff"] <= 1e-5 and r["fsdp_param_diff"] <= 1e-5, r
