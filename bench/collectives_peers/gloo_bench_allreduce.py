"""The torch.distributed (gloo) side of scripts/bench-collectives.sh.

all_reduce of float32 CPU tensors (sum), timed like tern_bench_collectives:
-n operations back to back after -w warm-up ones, the slowest rank's mean
time, the same CSV rows. Launch one process per rank with MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE set (as torchrun does).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_bytes(text):
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    if text[-1].upper() in units:
        return float(text[:-1]) * units[text[-1].upper()]
    return float(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", default="8")
    parser.add_argument("-e", default="64M")
    parser.add_argument("-f", type=float, default=2)
    parser.add_argument("-n", type=int, default=20)
    parser.add_argument("-w", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("impl,collective,ranks,size,count,type,redop,placement,time_us,algbw,busbw,wrong", flush=True)
    nbytes = parse_bytes(args.b)
    while nbytes <= parse_bytes(args.e) * 1.0000001:
        count = int(nbytes // 4)
        if count > 0:
            tensor = torch.zeros(count, dtype=torch.float32)
            for _ in range(args.w):
                dist.all_reduce(tensor)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.n):
                dist.all_reduce(tensor)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rank == 0:
                us = elapsed.item() / args.n * 1e6
                algbw = count * 4 / us / 1e3
                print(f"gloo,all_reduce,{size},{count * 4},{count},float,sum,in,{us:.3f},{algbw:.3f},"
                      f"{algbw * 2 * (size - 1) / size:.3f},-1", flush=True)
        nbytes *= args.f
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
