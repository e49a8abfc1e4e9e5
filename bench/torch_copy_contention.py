# torch_copy_contention.py — what a cut's device copy costs the PyTorch job by memory contention
# alone, and whether spreading the copy over the step lowers it (issue #21's worst-step target).
#
# No POS here: the job of workloads/torch_train.py trains natively while, every --every steps, a
# side stream copies --gib GiB device-to-device, the way a cut's copies run ahead of the job, in
# one of several shapes (variants take turns; `0` is the control, no copy):
#   BxN@G   N chunks of --gib/N issued G ms apart from a host thread, starting at the step's start
#           plus B ms (`1x0` = one burst at the step's start).
# For each variant: the extra time of the step the copy began in plus the next (against twice the
# median step of the control windows), and the worst step over the median.
#
#   python3 bench/torch_copy_contention.py [--gib 11.4] [--every 8] [--events 6]
#       [--variants '0;0x1@0;0x16@1.5;0x32@3;10x1@0'] [TRAIN_ARGS as torch_train.py]
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "workloads"))
import torch  # noqa: E402
import torch_train as tt  # noqa: E402


def parse_variant(s):
    if s == "0":
        return None
    head, gap = s.split("@")
    b, n = head.split("x")
    return float(b), int(n), float(gap)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=11.4)
    p.add_argument("--every", type=int, default=8)
    p.add_argument("--events", type=int, default=6)
    p.add_argument("--variants", default="0;0x1@0;0x16@1.5;0x32@3;10x1@0")
    ours, rest = p.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    a = tt.parse()
    variants = ours.variants.split(";")
    shapes = [parse_variant(v) for v in variants]
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = tt.GPT(a.vocab, a.dim, a.heads, a.layers, a.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)
    nbytes = int(ours.gib * (1 << 30)) // 4096 * 4096
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream()
    warm = 40
    total = warm + ours.every * ours.events * len(variants)
    starts = []
    events = {}  # step -> variant index

    def copier(shape, t_step):
        b, n, gap = shape
        chunk = nbytes // n
        for i in range(n):
            due = t_step + (b + i * gap) / 1000.0
            d = due - time.perf_counter()
            if d > 0:
                time.sleep(d)
            lo = i * chunk
            hi = nbytes if i == n - 1 else lo + chunk
            with torch.cuda.stream(side):
                dst[lo:hi].copy_(src[lo:hi])

    th = None
    for step in range(total):
        t = time.perf_counter()
        starts.append(t)
        k = step - warm
        if k >= 0 and k % ours.every == 0:
            v = (k // ours.every) % len(variants)
            events[step] = v
            if shapes[v] is not None:
                if th is not None:
                    th.join()
                th = threading.Thread(target=copier, args=(shapes[v], t))
                th.start()
        tt.train_step(model, opt, step, a, dev).item()
    torch.cuda.synchronize()
    starts.append(time.perf_counter())
    if th is not None:
        th.join()
    dur = [starts[i + 1] - starts[i] for i in range(len(starts) - 1)]
    ctrl = sorted(dur[s + j] for s, v in events.items() if shapes[v] is None for j in range(ours.every))
    med = ctrl[len(ctrl) // 2]
    print(f"model state {16 * sum(q.numel() for q in model.parameters()) / (1 << 30):.2f} GiB, "
          f"copy {nbytes / 1e9:.2f} GB, median step (control) {med * 1e3:.2f} ms, {ours.events} events each")
    print(f"{'variant':>10} {'extra ms (2 steps) mean':>24} {'min':>6} {'max':>6} {'worst/median':>13} "
          f"{'next steps worst':>17}")
    for vi, name in enumerate(variants):
        ex, worst, after = [], [], []
        for s, v in events.items():
            if v != vi:
                continue
            ex.append((dur[s] + dur[s + 1] - 2 * med) * 1e3)
            worst.append(max(dur[s], dur[s + 1]) / med)
            after.append(max(dur[s + 2:s + ours.every]) / med)
        print(f"{name:>10} {sum(ex) / len(ex):>24.2f} {min(ex):>6.2f} {max(ex):>6.2f} {max(worst):>12.2f}x "
              f"{max(after):>16.2f}x")


if __name__ == "__main__":
    main()
