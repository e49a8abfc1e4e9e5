# torch_share.py — a PyTorch job that wants its GPU all the time (bf16 matmuls), for the GPU-time
# share tests and bench of issue #24 (bench/share_bench.sh, docs/limits.md).
#
# It warms up, writes READY, waits for GO to exist (so that several jobs start their timed window
# together), then multiplies for SECONDS of wall time, synchronizing every --sync-every products,
# and prints "iterations N seconds S rate R" (R: products per second).
#
#   python3 workloads/torch_share.py --ready FILE --go FILE [--seconds 8] [--dim 4096] [--sync-every 20]
import argparse
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--ready", required=True)
p.add_argument("--go", required=True)
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--dim", type=int, default=4096)
p.add_argument("--sync-every", type=int, default=20)
a = p.parse_args()

x = torch.randn(a.dim, a.dim, device="cuda", dtype=torch.bfloat16)
y = torch.randn(a.dim, a.dim, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    z = x @ y
torch.cuda.synchronize()
with open(a.ready, "w") as f:
    f.write(str(os.getpid()))
while not os.path.exists(a.go):
    time.sleep(0.001)
t0 = time.monotonic()
n = 0
while True:
    z = x @ y
    n += 1
    if n % a.sync_every == 0:
        torch.cuda.synchronize()
        if time.monotonic() - t0 >= a.seconds:
            break
torch.cuda.synchronize()
dt = time.monotonic() - t0
print(f"iterations {n} seconds {dt:.3f} rate {n / dt:.2f}", flush=True)
