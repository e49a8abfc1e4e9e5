# torch_sms.py — what SMs a PyTorch job's kernels run on, for the SM limit of issue #24
# (`pos run --sms N`, docs/limits.md; unittest/torch_gpu_test.cc and bench/sm_limit_bench.sh).
#
# Prints three lines:
#   mp_count N          torch.cuda.get_device_properties(0).multi_processor_count
#   smids N             distinct SMs that the blocks of a Triton kernel ran on (each block records
#                       %smid and spins ~50 us, 8 blocks per SM of the whole GPU, so that every SM
#                       the context may use gets blocks)
#   matmul_tflops R     bf16 DIM x DIM matmuls for SECONDS of wall time
#
#   python3 workloads/torch_sms.py [--seconds 3] [--dim 8192] [--rounds R --gap S]
#
# --rounds R: the SM probe R times, one line each ("round K smids N"), S seconds apart, then "done",
# so that a dump and restore between two rounds shows what SMs the restored job runs on
# (bench/sm_restore_check.sh).
import argparse
import time

import torch
import triton
import triton.language as tl


@triton.jit
def smid_kernel(out_ptr, spin_ns):
    pid = tl.program_id(0)
    smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32, is_pure=False, pack=1)
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1)
    t = t0
    while t - t0 < spin_ns:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False,
                                      pack=1)
    tl.store(out_ptr + pid, smid)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--gap", type=float, default=0.5)
    a = p.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"mp_count {props.multi_processor_count}", flush=True)
    # The whole GPU's SM count comes from the driver's attribute, which the limit narrows; 8 blocks
    # per SM of the largest GPU made (256 SMs) covers every SM of any GPU the test runs on.
    blocks = 8 * 256
    out = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")

    def probe():
        out.fill_(-1)
        smid_kernel[(blocks,)](out, 50_000)
        torch.cuda.synchronize()
        seen = set(out.tolist())
        seen.discard(-1)
        return len(seen)

    if a.rounds > 0:
        for k in range(a.rounds):
            print(f"round {k} smids {probe()} mp_count {torch.cuda.get_device_properties(0).multi_processor_count}",
                  flush=True)
            time.sleep(a.gap)
        print("done", flush=True)
        return
    try:
        print(f"smids {probe()}", flush=True)
    except Exception as e:  # a Triton without inline asm: the matmul rate still says it
        print(f"smids unknown: {type(e).__name__}: {str(e)[:200]}", flush=True)
    x = torch.randn(a.dim, a.dim, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(a.dim, a.dim, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        z = x @ y
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        for _ in range(5):
            z = x @ y
        torch.cuda.synchronize()
        n += 5
    dt = time.perf_counter() - t0
    print(f"matmul_tflops {2 * a.dim ** 3 * n / dt / 1e12:.2f}", flush=True)
    del z


if __name__ == "__main__":
    main()
