# torch_train.py — a small GPT-style language model trained on synthetic tokens: the stock PyTorch
# job that POS must run, dump and restore unchanged (issue #20; docs/driver_runtime.md).
#
# Deterministic: fixed seeds, torch.use_deterministic_algorithms(True), the batch of step i a pure
# function of i (so a restored job draws the same batches). Prints one loss line per step, flushed,
# and a checksum of the parameters at the end; two runs that agree print the same bytes.
#
#   python3 workloads/torch_train.py [--layers N] [--dim D] [--heads H] [--vocab V] [--seq T]
#       [--batch B] [--steps S] [--compile] [--state-gib G] [--step-times]
#
# --state-gib sizes the model so that parameters + AdamW state (4 fp32 copies) come to about G GiB.
import argparse
import gc
import hashlib
import math
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed for deterministic cuBLAS

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim, bias=False)
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def parse():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--compile", action="store_true", help="train the torch.compile'd model (Triton kernels)")
    p.add_argument("--cudagraphs", action="store_true",
                   help="torch.compile with mode='reduce-overhead': Triton kernels replayed as CUDA graphs")
    p.add_argument("--state-gib", type=float, default=0.0,
                   help="widen --dim so that parameters + AdamW state come to about this many GiB")
    p.add_argument("--step-times", action="store_true",
                   help="print each step's start time (s) and where its time went to stderr")
    p.add_argument("--freeze", type=int, default=0,
                   help="freeze the first N blocks (fine-tuning the rest): their weights are read, never written")
    a = p.parse_args()
    if a.state_gib > 0:
        # Per block ~12 d^2 weights; embeddings and head 2 V d; 16 bytes per weight (fp32 param, grad,
        # two AdamW moments).
        target = a.state_gib * (1 << 30) / 16
        d = int((-2 * a.vocab + math.sqrt(4 * a.vocab ** 2 + 48 * a.layers * target)) / (24 * a.layers))
        a.dim = max(a.heads * 8, d // (a.heads * 8) * (a.heads * 8))
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")
    return a


def batch(step, a, device):
    g = torch.Generator(device="cpu").manual_seed(1000 + step)
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x = x.to(device, non_blocking=False)
    return x[:, :-1], x[:, 1:]


def train_step(fwd, opt, step, a, device, marks=None):
    """One step of training on batch `step`: its loss (a device tensor; reading it waits for the step).
    marks, if given, gets the host time at which the batch was on the device."""
    x, y = batch(step, a, device)
    if marks is not None:
        marks.append(time.perf_counter())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = fwd(x)
    loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def main():
    a = parse()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    model = GPT(a.vocab, a.dim, a.heads, a.layers, a.seq).to(dev)
    for b in model.blocks[:a.freeze]:
        b.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, weight_decay=0.1,
                            foreach=True)
    if a.cudagraphs:
        fwd = torch.compile(model, mode="reduce-overhead")
    else:
        fwd = torch.compile(model) if a.compile else model
    n = sum(p.numel() for p in model.parameters())
    print(f"model: layers {a.layers} dim {a.dim} heads {a.heads} vocab {a.vocab} seq {a.seq} batch {a.batch} "
          f"params {n} state {16 * n / (1 << 30):.2f} GiB" + (f" frozen blocks {a.freeze}" if a.freeze else ""),
          flush=True)
    gc_s = [0.0, None]  # time spent in Python's garbage collector, and when the running collection began
    if a.step_times:
        def on_gc(phase, info):
            if phase == "start":
                gc_s[1] = time.perf_counter()
            elif gc_s[1] is not None:
                gc_s[0] += time.perf_counter() - gc_s[1]
                gc_s[1] = None
        gc.callbacks.append(on_gc)
    for step in range(a.steps):
        if not a.step_times:
            loss = train_step(fwd, opt, step, a, dev)
            print(f"step {step} loss {loss.item():.6f}", flush=True)
            continue
        # Where a slow step's time went (bench/step_spread.sh --job torch): making the batch and
        # copying it over, issuing the step's GPU work, waiting for it, and Python's collector.
        print(f"step {step} start_s {time.time():.6f}", file=sys.stderr, flush=True)
        marks, gc_before = [time.perf_counter()], gc_s[0]
        loss = train_step(fwd, opt, step, a, dev, marks)
        marks.append(time.perf_counter())
        value = loss.item()
        marks.append(time.perf_counter())
        print(f"step {step} loss {value:.6f}", flush=True)
        ms = [1000 * (marks[i + 1] - marks[i]) for i in range(3)]
        print(f"step {step} phases batch_ms {ms[0]:.3f} issue_ms {ms[1]:.3f} wait_ms {ms[2]:.3f} "
              f"gc_ms {1000 * (gc_s[0] - gc_before):.3f}", file=sys.stderr, flush=True)
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    print(f"checksum {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
