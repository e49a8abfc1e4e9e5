#!/usr/bin/env bash
# policy_windows.sh — what a checkpoint policy costs one running job, measured inside one run: the
# policy is switched on and off in alternating windows (off, on, off, on, ..., off), so drift
# between runs (clocks, placement, the VM's neighbours) cannot be mistaken for the policy's cost.
#
# usage: bench/policy_windows.sh BUILD [--job mlp|torch] [--every 10s] [--ticks 3] [--pairs 6]
#                                [--warm S] [--dir DIR] [-- JOB ARGS...]
#   --job mlp    workloads/mlp_train_native under posd (CUDA backend), the job of continuous_bench.sh
#                (default args: 8.84 GB of parameters, half the layers frozen, batches made ahead on 4 threads)
#   --job torch  workloads/torch_train.py under `pos run` (in-process; default: 4 layers, --state-gib 8)
#   --every      the policy's interval; --ticks: ticks per "on" window, which lasts ticks x every
#                minus 0.5 s (a tick runs at the policy's start, then every interval: the window
#                holds exactly that many ticks, and the stop finds none running); "off" windows
#                last as long
#   --pairs      "on" windows; each is compared with the mean of the "off" windows either side
#   --warm       seconds of training before the first window (default 20)
#   --backend    posd's backend for --job mlp (default cuda; host: a smoke test without a GPU)
# Policy: pos-cli checkpoint --every T --keep 1 --full-every 3 (GPU state only), a fresh directory
# per window (its first point whole, as a policy's first point is). A step belongs to the window
# its start falls in; the steps of the switch itself (start or stop command to its answer) to none.
# Prints: per window the mean and median step, per "on" window its ratio to its neighbours, the
# mean ratio with a 95 % confidence interval (Student's t over the "on" windows), worst step / median
# for on and off, and the policy's ticks and pauses. Needs a GPU (CUDA backend).
#   --steady N   instead of windows: one policy runs for N intervals, as a user runs it, and each
#                interval is split in halves: the first holds the tick (it starts the interval and
#                must end within the half: the log's durations are checked), the second none. A
#                tick's cost is the step time of its half less as many steps at the mean of the
#                interval's other half; the overhead is their mean over the interval, with a 95 %
#                interval (Student's t over the ticks), and the worst step of each half is compared
#                with the median of the second halves, and with the median of the steps within 2.5 s
#                of it (the job's pace drifts with its host); the slowest steps are listed at their
#                offset into the interval, with torch_train.py's phases. Each tick's own steps
#                (those overlapping its start to 0.25 s after its end) are set apart from the rest
#                of the run: the tick's worst step beside the job's own. POS_BENCH_LOGS=DIR keeps
#                the policy's log and every step there. When writing is slower than the interval
#                (the log holds fewer ticks than intervals: coalesced), the run is judged whole:
#                its steps against the job's own over as long a stretch just before the policy.
#                Both print the RPO: the age of the newest complete point, sampled every 20 ms from
#                the policy's status file (as continuous_bench.sh does).
#   --job-cpus LIST, --posd-cpus LIST (taskset lists, both or neither): the job on cores of its own,
#                posd and pos-cli on others (the MLP job's step groups follow the cores its host
#                work runs on: bench/step_spread.sh)
set -uo pipefail
[[ $# -ge 1 && -d "$1" ]] || { sed -n 2,36p "$0" >&2; exit 2; }
BUILD="$(cd "$1" && pwd)"; shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOB=mlp EVERY=10s TICKS=3 PAIRS=6 WARM=20 DIR="" BACKEND=cuda STEADY=0 JOB_CPUS="" POSD_CPUS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --job) JOB="$2"; shift 2 ;;
    --every) EVERY="$2"; shift 2 ;;
    --ticks) TICKS="$2"; shift 2 ;;
    --pairs) PAIRS="$2"; shift 2 ;;
    --warm) WARM="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --steady) STEADY="$2"; shift 2 ;;
    --job-cpus) JOB_CPUS="$2"; shift 2 ;;
    --posd-cpus) POSD_CPUS="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "policy_windows: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $JOB == mlp || $JOB == torch ]] || { echo "policy_windows: --job is mlp or torch" >&2; exit 2; }
[[ -z "$JOB_CPUS$POSD_CPUS" || ( $JOB_CPUS =~ ^[0-9,-]+$ && $POSD_CPUS =~ ^[0-9,-]+$ ) ]] ||
  { echo "policy_windows: --job-cpus and --posd-cpus go together, as taskset lists" >&2; exit 2; }
[[ -n "$POSD_CPUS" ]] && POSD_PREFIX=(taskset -c "$POSD_CPUS")
ARGS=("$@")
if [[ ${#ARGS[@]} -eq 0 ]]; then
  if [[ $JOB == mlp ]]; then ARGS=(--input 1024 --hidden 16384 --layers 8 --output 256 --batch 256 --frozen 4 --prefetch 4)
  else ARGS=(--layers 4 --state-gib 8); fi
fi
for f in tools/posd tools/pos-cli tools/pos workloads/mlp_train_native remoting/client/libpos_client.so; do
  [[ -e "$BUILD/$f" ]] || { echo "policy_windows: $BUILD/$f is missing" >&2; exit 2; }
done
source "$ROOT/bench/policy_common.sh"
bench_scratch policy-windows
[[ $JOB == mlp ]] && start_bench_posd "$BACKEND"
[[ $STEADY -gt 0 ]] && SHAPE="one policy for $STEADY intervals" || SHAPE="$TICKS ticks per window, $PAIRS on-windows"
echo "job: $JOB ${ARGS[*]}; policy every $EVERY, $SHAPE; points in $WORK ($(df -PT "$WORK" | awk 'NR==2{print $2}'))"
BUILD="$BUILD" ROOT="$ROOT" SOCK="$SOCK" TMP="$TMP" WORK="$WORK" JOB="$JOB" EVERY="$EVERY" TICKS="$TICKS" \
PAIRS="$PAIRS" WARM="$WARM" STEADY="$STEADY" JOB_CPUS="$JOB_CPUS" POSD_CPUS="$POSD_CPUS" python3 - "${ARGS[@]}" <<'PY'
import bisect, json, os, re, signal, statistics, subprocess, sys, threading, time
E = os.environ
B, TMP, WORK, kind = E["BUILD"], E["TMP"], E["WORK"], E["JOB"]
cli = B + "/tools/pos-cli"
every = E["EVERY"]
m = re.fullmatch(r"([0-9.]+)(ms|s|m)?", every)
if not m: sys.exit(f"policy_windows: cannot read the interval '{every}'")
every_s = float(m.group(1)) * {"ms": 1e-3, "s": 1, "m": 60, None: 1}[m.group(2)]
ticks, pairs, warm = int(E["TICKS"]), int(E["PAIRS"]), float(E["WARM"])
window = ticks * every_s - 0.5
env = dict(os.environ, POS_JOBS_DIR=TMP + "/jobs")
if kind == "mlp":
    env.update(POS_SOCKET=E["SOCK"], LD_LIBRARY_PATH="/usr/local/cuda/lib64",
               LD_PRELOAD=B + "/remoting/client/libpos_client.so", POS_ARENA_SIZE="1GiB")
    cmd = [B + "/workloads/mlp_train_native", *sys.argv[1:], "--steps", "1000000", "--step-times"]
    now = time.monotonic  # mlp_train prints start_s on CLOCK_MONOTONIC
    cli_extra = ["--socket", E["SOCK"]]
else:
    cmd = [B + "/tools/pos", "run", "--", "python3", E["ROOT"] + "/workloads/torch_train.py", *sys.argv[1:],
           "--steps", "1000000", "--step-times"]
    now = time.time  # torch_train.py prints start_s from time.time()
    cli_extra = []
# Pinned: taskset execs the job (its pid is the job's); pos-cli on posd's cores.
job_pin = ["taskset", "-c", E["JOB_CPUS"]] if E["JOB_CPUS"] else []
cli_pin = ["taskset", "-c", E["POSD_CPUS"]] if E["POSD_CPUS"] else []
cmd = job_pin + cmd
out = open(TMP + "/job.out", "w")
job = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
starts, tail, phases = [], [], {}  # phases: step index -> torch_train.py's "phases" fields
def reader():
    for line in job.stderr:
        mm = re.match(r"step (\d+) .*start_s ([0-9.]+)", line)
        if mm: starts.append(float(mm.group(2))); continue
        mm = re.match(r"step (\d+) phases (.*)", line)
        if mm: phases[int(mm.group(1))] = mm.group(2).strip(); continue
        tail.append(line); del tail[:-40]
threading.Thread(target=reader, daemon=True).start()
def fail(msg):
    job.kill()
    sys.exit(f"policy_windows: {msg}\n{''.join(tail)}")
t0 = time.monotonic()
while len(starts) < 20:
    if job.poll() is not None: fail(f"the job ended (exit {job.returncode}) before its 20th step")
    if time.monotonic() - t0 > 600: fail("no 20th step within 600 s")
    time.sleep(0.1)
time.sleep(warm)
T = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
     11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
     21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}
steady = int(E["STEADY"])
if steady > 0:
    d = WORK + "/steady"
    c = cli_pin + [cli, "checkpoint", "-t", str(job.pid), "-D", d, "--every", every, "--keep", "1", "--full-every", "3",
                   "--jobs-dir", TMP + "/jobs", *cli_extra]
    t_start = now()  # the first tick starts as the policy does: between this and the answer
    r = subprocess.run(c, env=env, capture_output=True, text=True)
    if r.returncode != 0: fail(f"pos-cli checkpoint failed: {r.stderr.strip()}")
    t_answer = now()
    # RPO, as continuous_bench.sh reads it: sampled every 20 ms from the policy's status file, now
    # minus the cut of the newest complete point (its completion minus its duration).
    status_path, newest, cut, rpo = f"{TMP}/jobs/checkpoints/{job.pid}.json", None, None, 0.0
    end = time.monotonic() + steady * every_s + 0.3
    while time.monotonic() < end:
        try: js = json.load(open(status_path))
        except Exception: js = None
        tn = time.time()
        if js and js.get("newest") and js["newest"] != newest:
            newest, cut = js["newest"], tn - js["last_duration_us"] / 1e6
        if cut is not None: rpo = max(rpo, tn - cut)
        time.sleep(0.02)
    r = subprocess.run([cli, "checkpoint", "-t", str(job.pid), "--stop", "--jobs-dir", TMP + "/jobs", *cli_extra],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0: fail(f"pos-cli checkpoint --stop failed: {r.stderr.strip()}")
    for _ in range(400):
        if os.path.exists(d + "/checkpoint.log") and "stopped" in open(d + "/checkpoint.log").read(): break
        time.sleep(0.05)
    log = open(d + "/checkpoint.log").read() if os.path.exists(d + "/checkpoint.log") else ""
    job.send_signal(signal.SIGKILL)
    job.wait()
    took = [float(x) for x in re.findall(r"([0-9.]+) s in all", log)]
    def rpo_line():
        # A tick that outlasts the interval starts the next at once (coalesced): the bound is then
        # the longest tick twice.
        bound = max(every_s, max(took)) + max(took) if took else float("nan")
        return (f"RPO max {rpo:.2f} s (age of the newest complete point, sampled every 20 ms); the interval "
                f"(or the longest tick, if longer) plus the longest tick: {bound:.2f} s")
    steps = [(starts[i], (starts[i + 1] - starts[i]) * 1e3) for i in range(len(starts) - 1)]
    def finish():
        # Both shapes end alike: the ticks' totals, the RPO, and (POS_BENCH_LOGS) the log and the steps kept.
        tk = [(float(a), float(b)) for a, b in re.findall(r"([0-9.]+) MB written.*?the job paused ([0-9.]+) ms", log)]
        if tk:
            print(f"ticks: {len(tk)}; MB written per tick mean {statistics.mean(a for a, _ in tk):.0f}; tick s mean "
                  f"{statistics.mean(took):.2f}, max {max(took):.2f}; job paused median "
                  f"{statistics.median(b for _, b in tk):.3f} ms, max {max(b for _, b in tk):.3f} ms")
        print(rpo_line())
        if os.environ.get("POS_BENCH_LOGS"):
            os.makedirs(os.environ["POS_BENCH_LOGS"], exist_ok=True)
            open(os.environ["POS_BENCH_LOGS"] + "/checkpoint.log", "w").write(log)
            with open(os.environ["POS_BENCH_LOGS"] + "/steps.txt", "w") as f:
                f.write(f"# t_start {t_start:.6f} every_s {every_s}\n")
                for i, (st, ms) in enumerate(steps):
                    f.write(f"{i} {st:.6f} {ms:.3f} {phases.get(i, '')}\n")
        sys.exit(0)
    if len(took) < steady:
        # Writing took longer than the interval: the policy coalesced ticks and moved its schedule,
        # so the intervals' halves no longer hold one tick each. What is left to judge is the whole
        # run under the policy against the job's own steps just before it (as long a stretch).
        span = steady * every_s
        under = [ms for st, ms in steps if t_start <= st < t_start + span]
        before = [ms for st, ms in steps if t_start - span <= st < t_start]
        if len(under) < 5 or len(before) < 5: fail("too few steps under the policy or before it")
        mb, mu = statistics.median(before), statistics.median(under)
        print(f"{len(took)} ticks in {steady} intervals of {every_s:g} s: ticks coalesced (a tick took up to "
              f"{max(took):.2f} s, longer than the interval); the run judged whole, against the {span:g} s before the policy")
        print(f"steps before the policy: {len(before)}, mean {statistics.mean(before):.3f} ms, median {mb:.3f}, worst / median "
              f"{max(before) / mb:.2f} ({sum(x > 1.2 * mb for x in before)} over 1.2)")
        print(f"steps under the policy: {len(under)}, mean {statistics.mean(under):.3f} ms "
              f"({100 * (statistics.mean(under) / statistics.mean(before) - 1):+.2f} % on the mean before), median {mu:.3f}; "
              f"worst / the median before {max(under) / mb:.2f} ({sum(x > 1.2 * mb for x in under)} over 1.2)")
        finish()
    half = every_s / 2
    if max(took[:steady]) > half - 0.5:
        print(f"warning: a tick took {max(took[:steady]):.2f} s, longer than the first half less 0.5 s")
    print(f"policy started {1e3 * (t_answer - t_start):.0f} ms after it was asked; {steady} intervals of {every_s:g} s")
    # The tick's own steps: those that overlap its window (its start to 0.25 s after its end, by the
    # log's duration), against the steps of the same run outside every window: what a tick adds,
    # beside the spread the job has by itself.
    win = [(t_start + k * every_s, t_start + k * every_s + took[k] + 0.25) for k in range(steady)]
    in_win, outside = [[] for _ in range(steady)], []
    for st, ms in steps:
        hit = [k for k, (w0, w1) in enumerate(win) if st < w1 and st + ms / 1e3 > w0]
        if hit: in_win[hit[0]].append(ms)
        elif t_start <= st < t_start + steady * every_s: outside.append(ms)
    if not outside or any(not w for w in in_win): fail("a tick's window or the rest of the run holds no step")
    print("| tick | tick s | steps (first half, second) | mean ms (first, second) | lost ms | worst / median of the second halves (first, second) | the tick's window: steps, worst / median |")
    print("|---|---|---|---|---|---|---|")
    lost, firsts, seconds = [], [], []
    for k in range(steady):
        a0 = t_start + k * every_s
        A = [ms for st, ms in steps if a0 <= st < a0 + half]
        Bh = [ms for st, ms in steps if a0 + half <= st < a0 + every_s]
        if len(A) < 5 or len(Bh) < 5: fail(f"interval {k} holds too few steps")
        firsts.append(A); seconds.append(Bh)
        lost.append(sum(A) - len(A) * statistics.mean(Bh))
    med2 = statistics.median([x for b in seconds for x in b])
    for k in range(steady):
        A, Bh = firsts[k], seconds[k]
        print(f"| {k + 1} | {took[k]:.2f} | {len(A)}, {len(Bh)} | {statistics.mean(A):.3f}, {statistics.mean(Bh):.3f} | "
              f"{lost[k]:.1f} | {max(A) / med2:.2f}, {max(Bh) / med2:.2f} | {len(in_win[k])}, {max(in_win[k]) / med2:.2f} |")
    ml = statistics.mean(lost)
    hw = T.get(steady - 1, 2.0) * statistics.stdev(lost) / steady ** 0.5 if steady > 1 else float("nan")
    base = statistics.mean([x for b in seconds for x in b])
    per_interval = every_s * 1e3 / base  # steps per interval at the second halves' pace
    print()
    print(f"lost per tick: {ml:.1f} ms (95 % CI {ml - hw:.1f} to {ml + hw:.1f} ms); over the {every_s:g} s interval: "
          f"overhead {100 * ml / (every_s * 1e3):+.2f} % (95 % CI {100 * (ml - hw) / (every_s * 1e3):+.2f} % to "
          f"{100 * (ml + hw) / (every_s * 1e3):+.2f} %)")
    print(f"steps: second halves {base:.3f} ms mean (median {med2:.3f}), {per_interval:.0f} per interval; worst step / that "
          f"median: first halves {max(max(a) for a in firsts) / med2:.2f}, second halves {max(max(b) for b in seconds) / med2:.2f}")
    # The job's pace drifts on this kind of host (5 s medians 28.7-30.6 ms for the PyTorch job, the
    # issuing of its launches on the host), so each step is also judged against the median of the
    # steps within 2.5 s of it: a tick's own slow steps against those of the tick-free halves.
    ts = [st for st, _ in steps]
    def local(i):
        a, b = bisect.bisect_left(ts, ts[i] - 2.5), bisect.bisect_right(ts, ts[i] + 2.5)
        return steps[i][1] / statistics.median(ms for _, ms in steps[a:b])
    rel = [[], []]  # first halves, second halves
    for i, (st, ms) in enumerate(steps):
        if t_start <= st < t_start + steady * every_s:
            rel[((st - t_start) % every_s) >= half].append(local(i))
    later = [max(w) / med2 for w in in_win[1:]]
    print(f"the ticks' own steps (each tick's window: its start to 0.25 s after its end), worst / that median: first "
          f"tick {max(in_win[0]) / med2:.2f}" + (f", later ticks {min(later):.2f}-{max(later):.2f} ({sum(x > 1.2 for x in later)} "
          f"of {len(later)} over 1.2)" if later else "") + f"; the {len(outside)} steps outside every window: worst "
          f"{max(outside) / med2:.2f} ({sum(x > 1.2 * med2 for x in outside)} over 1.2)")
    print("worst step / the median of the steps within 2.5 s of it: first halves %.2f (%d over 1.2), second halves "
          "%.2f (%d over 1.2)" % (max(rel[0]), sum(x > 1.2 for x in rel[0]), max(rel[1]), sum(x > 1.2 for x in rel[1])))
    # Where the slowest steps fell: their offset from their interval's start (the tick's), and, for
    # torch_train.py, where the step's time went (making the batch, issuing, waiting, the collector).
    print(f"slowest steps (offset from the interval's start; x the second halves' median):")
    idx = sorted(range(len(steps)), key=lambda i: -steps[i][1])
    shown = 0
    for i in idx:
        st, ms = steps[i]
        k = int((st - t_start) // every_s)
        if not 0 <= k < steady: continue
        print(f"  interval {k + 1} +{st - t_start - k * every_s:.2f} s: {ms:.2f} ms ({ms / med2:.2f}x, {local(i):.2f}x locally)"
              + (f"; {phases[i]}" if i in phases else ""))
        shown += 1
        if shown == 8: break
    finish()
windows, logs = [], []  # windows: (kind, begin, end) on the job's clock
def off_window():
    b = now(); time.sleep(window); windows.append(("off", b, now()))
def on_window(i):
    d = f"{WORK}/w{i}"
    c = [cli, "checkpoint", "-t", str(job.pid), "-D", d, "--every", every, "--keep", "1", "--full-every", "3",
         "--jobs-dir", TMP + "/jobs", *cli_extra]
    r = subprocess.run(c, env=env, capture_output=True, text=True)
    if r.returncode != 0: fail(f"pos-cli checkpoint failed: {r.stderr.strip()}")
    b = now(); time.sleep(window); e = now()
    r = subprocess.run([cli, "checkpoint", "-t", str(job.pid), "--stop", "--jobs-dir", TMP + "/jobs", *cli_extra],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0: fail(f"pos-cli checkpoint --stop failed: {r.stderr.strip()}")
    # The stop returns once the checkpointer has stopped (the tick in progress, if any, finished).
    windows.append(("on", b, e))
    for _ in range(200):
        if os.path.exists(d + "/checkpoint.log") and "stopped" in open(d + "/checkpoint.log").read(): break
        time.sleep(0.05)
    logs.append(open(d + "/checkpoint.log").read() if os.path.exists(d + "/checkpoint.log") else "")
    subprocess.run(["rm", "-rf", d])
off_window()
for i in range(pairs):
    on_window(i)
    off_window()
    if job.poll() is not None: fail(f"the job ended (exit {job.returncode}) during the windows")
job.send_signal(signal.SIGKILL)
job.wait()
steps = [(starts[i], (starts[i + 1] - starts[i]) * 1e3) for i in range(len(starts) - 1)]
def in_window(w):
    return [ms for s, ms in steps if w[1] <= s and s + ms / 1e3 <= w[2]]
per = [(w[0], in_window(w)) for w in windows]
if any(len(t) < 5 for _, t in per): fail("a window holds fewer than 5 steps: make the windows longer")
print("| window | steps | mean step ms | median | max | max / median | on / mean of the off windows either side |")
print("|---|---|---|---|---|---|---|")
ratios = []
for i, (k, t) in enumerate(per):
    rel = ""
    if k == "on":
        r = statistics.mean(t) / statistics.mean([statistics.mean(per[i - 1][1]), statistics.mean(per[i + 1][1])])
        ratios.append(r); rel = f"{r:.4f}"
    med = statistics.median(t)
    print(f"| {i}: {k} | {len(t)} | {statistics.mean(t):.3f} | {med:.3f} | "
          f"{max(t):.3f} | {max(t) / med:.2f} | {rel} |")
mr = statistics.mean(ratios)
half = T.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
on = [x for k, t in per if k == "on" for x in t]
off = [x for k, t in per if k == "off" for x in t]
tk = [(float(a), float(b)) for a, b in re.findall(r"([0-9.]+) MB written.*?the job paused ([0-9.]+) ms", "\n".join(logs))]
print()
print(f"policy on / off, mean of {len(ratios)} windows: {mr:.4f} (overhead {100 * (mr - 1):+.2f} %, 95 % CI "
      f"{100 * (mr - half - 1):+.2f} % to {100 * (mr + half - 1):+.2f} %)")
print(f"pooled steps: on {statistics.mean(on):.3f} ms mean (median {statistics.median(on):.3f}, max / median "
      f"{max(on) / statistics.median(on):.2f}); off {statistics.mean(off):.3f} ms mean (median "
      f"{statistics.median(off):.3f}, max / median {max(off) / statistics.median(off):.2f})")
if tk:
    print(f"ticks: {len(tk)} in {len(ratios)} on-windows of {window:.1f} s; MB written per tick mean {statistics.mean(a for a, _ in tk):.0f}; "
          f"job paused median {statistics.median(b for _, b in tk):.3f} ms, max {max(b for _, b in tk):.3f} ms")
else:
    print("ticks: none found in the checkpoint logs")
    sys.exit(1)
PY
