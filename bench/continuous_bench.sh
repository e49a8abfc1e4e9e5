#!/usr/bin/env bash
# continuous_bench.sh — what continuous checkpointing costs a training job under posd: the same run
# without a policy and with `pos-cli checkpoint --every T` for each T, one table of step times,
# bytes per tick, the job's pauses and the recovery point (age of the newest restore point).
#
# usage: bench/continuous_bench.sh BUILD [--every "10s 2s"] [--steps N] [--with-cpu] [--keep K]
#                                  [--full-every K] [--dir DIR] [--backend cuda|host] [-- MODEL ARGS...]
#   BUILD       meson build directory (tools/posd, tools/pos-cli, workloads/mlp_train_native)
#   --every     the intervals to measure, each a run of its own after the run without (default "10s 2s")
#   --steps     training steps per run (default 1500); steps 0-9 are warm-up, left out of the figures
#   --rounds    each configuration runs this often (default 2), in turns (none, T1, T2, none, T1, ...)
#               after one short warm-up run that is not counted: the machine's drift hits all alike
#   --with-cpu  restore points of GPU and CPU state (CRIU); default GPU state only
#   --keep, --full-every   the policy's (default 1 and 3: the disk holds the one point kept, made whole
#               by retention when it builds on the one before)
#   --keep-shadows true|false|auto   posd's checkpoint.keep_shadows (default true, as for the jobs a
#               YAML policy names: the shadows of one tick are kept for the next)
#   --dir       where the points go (default /dev/shm when it has room for 3x the job, else $TMPDIR)
#   --job-cpus LIST, --posd-cpus LIST (taskset lists, both or neither): the job on cores of its own,
#               posd and the policy's checkpointer on others (the job's host work is what spreads
#               its steps: bench/step_spread.sh)
#   MODEL ARGS  default: ~9.5 GB of parameters, half of the layers frozen (--frozen 4: their tensors
#               never change, so incremental points leave them to the whole one), each batch made
#               ahead on 4 threads (--prefetch 4, as a data loader's workers do: made at each step's
#               start on one thread it was most of the step, and its speed followed the host core's,
#               which hid POS's part of the step; docs/BENCHMARKS.md, 2026-11-29)
# Every run must print the same losses and checksum as the run without a policy, else exit 1.
# RPO: sampled every 20 ms from the policy's status file while the job trains (until its last
# step): at each moment, now minus the cut of the newest complete point (its completion minus its
# duration); the table gives the largest. Disk: the points in DIR and the bytes they occupy (du, each
# hard-linked file once, holes not counted), sampled every second; the table gives the largest, and
# how long retention took to make a point whole (mean).
set -uo pipefail
[[ $# -ge 1 && -d "$1" ]] || { sed -n 2,26p "$0" >&2; exit 2; }
BUILD="$(cd "$1" && pwd)"; shift
EVERY="10s 2s"; STEPS=1500; WITH_CPU=""; KEEP=1; FULL=3; DIR=""; BACKEND=cuda; ROUNDS=2 JOB_CPUS="" POSD_CPUS=""
MODEL=(--input 1024 --hidden 16384 --layers 8 --output 256 --batch 256 --frozen 4 --prefetch 4)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --every) EVERY="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --with-cpu) WITH_CPU="--with-cpu"; shift ;;
    --keep) KEEP="$2"; shift 2 ;;
    --full-every) FULL="$2"; shift 2 ;;
    --keep-shadows) KEEP_SHADOWS="$2"; [[ $KEEP_SHADOWS =~ ^(true|false|auto)$ ]] || { echo "continuous_bench: --keep-shadows is true, false or auto" >&2; exit 2; }; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --job-cpus) JOB_CPUS="$2"; [[ $JOB_CPUS =~ ^[0-9,-]+$ ]] || { echo "continuous_bench: bad --job-cpus" >&2; exit 2; }; shift 2 ;;
    --posd-cpus) POSD_CPUS="$2"; [[ $POSD_CPUS =~ ^[0-9,-]+$ ]] || { echo "continuous_bench: bad --posd-cpus" >&2; exit 2; }; shift 2 ;;
    --) shift; MODEL=("$@"); break ;;
    *) echo "continuous_bench: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -z "$JOB_CPUS" && -z "$POSD_CPUS" || -n "$JOB_CPUS" && -n "$POSD_CPUS" ]] ||
  { echo "continuous_bench: --job-cpus and --posd-cpus go together" >&2; exit 2; }
[[ -n "$POSD_CPUS" ]] && POSD_PREFIX=(taskset -c "$POSD_CPUS")
for f in tools/posd tools/pos-cli workloads/mlp_train_native remoting/client/libpos_client.so; do
  [[ -e "$BUILD/$f" ]] || { echo "continuous_bench: $BUILD/$f is missing" >&2; exit 2; }
done
source "$(dirname "${BASH_SOURCE[0]}")/policy_common.sh"
bench_scratch continuous-bench
start_bench_posd "$BACKEND"
echo "points: $WORK ($(df -PT "$WORK" | awk 'NR==2{print $2}')); job: mlp_train_native ${MODEL[*]} --steps $STEPS; backend $BACKEND" \
  "${JOB_CPUS:+; job on cores $JOB_CPUS, posd and the checkpointer on $POSD_CPUS}"

BUILD="$BUILD" SOCK="$SOCK" TMP="$TMP" WORK="$WORK" STEPS="$STEPS" EVERY="$EVERY" WITH_CPU="$WITH_CPU" KEEP="$KEEP" \
FULL="$FULL" ROUNDS="$ROUNDS" JOB_CPUS="$JOB_CPUS" POSD_CPUS="$POSD_CPUS" python3 - "${MODEL[@]}" <<'PY'
import json, os, re, statistics, subprocess, sys, time
B, SOCK, TMP, WORK = os.environ["BUILD"], os.environ["SOCK"], os.environ["TMP"], os.environ["WORK"]
steps, model = os.environ["STEPS"], sys.argv[1:]
cli = B + "/tools/pos-cli"
env = dict(os.environ, POS_SOCKET=SOCK, LD_LIBRARY_PATH="/usr/local/cuda/lib64",
           LD_PRELOAD=B + "/remoting/client/libpos_client.so", POS_JOBS_DIR=TMP + "/jobs",
           POS_ARENA_SIZE="1GiB")  # the job pins 256 MiB of staging for its checksum

pin = lambda cpus: ["taskset", "-c", cpus] if cpus else []

def run(every, rnd=0, warm=False):
    tag = (every or "none") + f"-{rnd}"
    out, err = open(f"{TMP}/{tag}.out", "w"), open(f"{TMP}/{tag}.err", "w+")
    job = subprocess.Popen(pin(os.environ["JOB_CPUS"]) + [B + "/workloads/mlp_train_native", *model, "--steps", "30" if warm else steps, "--step-times"],
                           env=dict(env, POS_JOB_NAME="bench-" + tag), stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    samples, status_path = [], f"{TMP}/jobs/checkpoints/{job.pid}.json"
    if every:
        while job.poll() is None:  # warm: step 10 done
            err.flush()
            if re.search(r"^step 10 time_ms", open(err.name).read(), re.M): break
            time.sleep(0.05)
        d = f"{WORK}/{tag}"
        cmd = pin(os.environ["POSD_CPUS"]) + [cli, "checkpoint", "-t", str(job.pid), "-D", d, "--every", every, "--keep", os.environ["KEEP"],
               "--full-every", os.environ["FULL"], "--socket", SOCK, "--jobs-dir", TMP + "/jobs"]
        if os.environ["WITH_CPU"]: cmd.append("--with-cpu")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        newest, rpo, cut = None, 0.0, None
        disk_at, disk_max, points_max, spans = 0.0, 0, 0, []
        while job.poll() is None:
            if time.time() - disk_at >= 1:
                disk_at = time.time()
                du = subprocess.run(["du", "-sB1", d], capture_output=True, text=True).stdout.split()
                if du: disk_max = max(disk_max, int(du[0]))
                if os.path.isdir(d):
                    points_max = max(points_max, sum(1 for n in os.listdir(d)
                                                     if re.fullmatch(r"cp-\d+", n) and os.path.exists(f"{d}/{n}/manifest")))
            # The recovery point matters while the job trains: sampling ends with its last step.
            if "mean step time" in open(err.name).read()[-4096:]: break
            try: s = json.load(open(status_path))
            except Exception: s = None
            now = time.time()
            if s and s["newest"] and s["newest"] != newest:
                newest, cut = s["newest"], now - s["last_duration_us"] / 1e6
                spans.append((cut, now))  # the tick, until the status names its point (complete)
            if cut is not None: rpo = max(rpo, now - cut)
            time.sleep(0.02)
        job.wait()
        time.sleep(0.3)
        s = json.load(open(status_path))
        log = open(d + "/checkpoint.log").read() if os.path.exists(d + "/checkpoint.log") else ""
        subprocess.run(["rm", "-rf", d])
    else:
        job.wait()
        s, log, rpo, disk_max, points_max, spans = None, "", 0, 0, 0, []
    if job.returncode != 0:
        sys.exit(f"continuous_bench: the {tag} run failed (exit {job.returncode}): {open(err.name).read()[-800:]}")
    text = open(err.name).read()
    t = [float(m.group(2)) for m in re.finditer(r"^step (\d+) time_ms ([0-9.]+)", text, re.M) if int(m.group(1)) >= 10]
    phases = [(float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5))) for m in
              re.finditer(r"^step (\d+) time_ms ([0-9.]+) .*gen_ms ([0-9.]+) issue_ms ([0-9.]+) wait_ms ([0-9.]+)", text, re.M)
              if int(m.group(1)) >= 10]
    # The three slowest steps, each placed against the nearest tick: seconds from the tick's start
    # and from the moment the status named its point (negative: before).
    worst = []
    for m in sorted(re.finditer(r"^step (\d+) time_ms ([0-9.]+) .*wall_s ([0-9.]+)(?: gen_ms ([0-9.]+) issue_ms ([0-9.]+) wait_ms ([0-9.]+))?", text, re.M),
                    key=lambda m: -float(m.group(2))):
        if int(m.group(1)) < 10: continue
        w = float(m.group(3))
        near = min(spans, key=lambda sp: abs(w - sp[0])) if spans else None
        worst.append(f"step {m.group(1)} {float(m.group(2)):.0f} ms" +
                     (f" (gen {float(m.group(4)):.0f}, issue {float(m.group(5)):.0f}, wait {float(m.group(6)):.0f})" if m.group(4) else "") +
                     (f" (tick start {w - near[0]:+.2f} s, point complete {w - near[1]:+.2f} s)" if near else ""))
        if len(worst) == 3: break
    if os.environ.get("POS_BENCH_LOGS"):
        os.makedirs(os.environ["POS_BENCH_LOGS"], exist_ok=True)
        open(f"{os.environ['POS_BENCH_LOGS']}/{tag}.err", "w").write(text)
        open(f"{os.environ['POS_BENCH_LOGS']}/{tag}.checkpoint.log", "w").write(log)
    ticks = [(float(a), float(b or 0), float(c), float(d)) for a, b, c, d in
             re.findall(r"cp-\d+: (?:whole|on cp-\d+), ([0-9.]+) MB written(?:, (\d+) MB left to earlier points)?, "
                        r"the job paused ([0-9.]+) ms, ([0-9.]+) s in all", log)]
    whole = [float(x) for x in re.findall(r"made whole in ([0-9.]+) s", log)]
    return dict(every=every, steps=t, status=s, ticks=ticks, rpo=rpo, out=open(f"{TMP}/{tag}.out").read(),
                disk=disk_max, points=points_max, whole=whole, worst=worst, phases=phases)

run(None, warm=True)
configs = [None] + os.environ["EVERY"].split()
runs = [run(e, r) for r in range(int(os.environ["ROUNDS"])) for e in configs]
base = runs[0]
bad = [(r["every"] or "none") for r in runs[1:] if r["out"] != base["out"]]
mean0 = statistics.mean(statistics.mean(r["steps"]) for r in runs if r["every"] is None)
print(f"{os.environ['ROUNDS']} runs of each, in turns; figures pooled over a configuration's runs")
print("| policy | ticks (coalesced, failed) | mean step ms | / none | median | max | max / median | MB per tick "
      "(mean, first) | MB left to earlier points (mean) | job paused ms (median, max) | tick s (mean, max) | RPO max s "
      "| points on disk (max) | GB on disk (max) | made whole: count, s (mean) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for e in configs:
    rs = [r for r in runs if r["every"] == e]
    t = [x for r in rs for x in r["steps"]]
    k = [x for r in rs for x in r["ticks"]]
    ss = [r["status"] for r in rs if r["status"]]
    med = statistics.median(t)
    cols = ["none" if e is None else "every " + e + (" +cpu" if os.environ["WITH_CPU"] else ""),
            "-" if not ss else f"{sum(s['taken'] for s in ss)} ({sum(s['coalesced'] for s in ss)}, {sum(s['failed'] for s in ss)})",
            f"{statistics.mean(t):.2f}", f"{statistics.mean(t) / mean0:.4f}", f"{med:.2f}", f"{max(t):.2f}",
            f"{max(t) / med:.2f}",
            "-" if not k else f"{statistics.mean(x[0] for x in k):.0f}, {k[0][0]:.0f}",
            "-" if not k else f"{statistics.mean(x[1] for x in k):.0f}",
            "-" if not k else f"{statistics.median(x[2] for x in k):.3f}, {max(x[2] for x in k):.3f}",
            "-" if not k else f"{statistics.mean(x[3] for x in k):.2f}, {max(x[3] for x in k):.2f}",
            "-" if not ss else f"{max(r['rpo'] for r in rs):.2f}",
            "-" if not ss else str(max(r["points"] for r in rs)),
            "-" if not ss else f"{max(r['disk'] for r in rs) / 1e9:.2f}",
            "-" if not ss else (lambda w: f"{len(w)}, {statistics.mean(w):.3f}" if w else "0")([x for r in rs for x in r["whole"]])]
    print("| " + " | ".join(cols) + " |")
print("phases of a step, ms (the job's --step-times): host batch generation (the GPU idles), issuing the GPU")
print("work, waiting for it; medians, then the slow steps' (> 1.1x the median) mean extra over them")
for e in configs:
    ph = [p for r in runs if r["every"] == e for p in r["phases"]]
    if len(ph) < 3: continue
    med = [statistics.median(p[i] for p in ph) for i in range(4)]
    slow = [p for p in ph if p[0] > 1.1 * med[0]]
    extra = [statistics.mean(p[i] for p in slow) - med[i] if slow else 0.0 for i in range(4)]
    print(f"  {'none' if e is None else 'every ' + e}: gen {med[1]:.2f}, issue {med[2]:.2f}, wait {med[3]:.2f}; "
          f"{len(slow)} slow steps, extra gen {extra[1]:+.2f}, issue {extra[2]:+.2f}, wait {extra[3]:+.2f}")
# posd's log: what each tick's copy-on-write cost the job's calls (the worker copying the buffers the
# job wrote before the drain reached them), over every policy run.
cow = [(float(a), float(b), float(c or 0)) for a, b, c in
       re.findall(r"the job's calls waited ([0-9.]+) ms for ([0-9.]+) MB of copy-on-write shadows(?:, ([0-9.]+) ms of it allocating)?",
                  open(TMP + "/posd.log", errors="replace").read())]
if os.environ.get("POS_BENCH_LOGS"):
    open(f"{os.environ['POS_BENCH_LOGS']}/posd.log", "w").write(open(TMP + "/posd.log", errors="replace").read()[-200000:])
if cow:
    print(f"copy-on-write, per tick ({len(cow)}): the job's calls waited median {statistics.median(c[0] for c in cow):.1f} ms, "
          f"max {max(c[0] for c in cow):.1f} ms; shadowed median {statistics.median(c[1] for c in cow):.0f} MB, "
          f"max {max(c[1] for c in cow):.0f} MB; allocating them median {statistics.median(c[2] for c in cow):.1f} ms")
print("mean step ms of each run, in the order run: " +
      ", ".join(f"{r['every'] or 'none'} {statistics.mean(r['steps']):.2f}" for r in runs))
for r in runs:
    print(f"slowest steps, {r['every'] or 'none'}: " + "; ".join(r["worst"]))
print(f"outputs identical to the run without a policy: {'yes' if not bad else 'NO: ' + ', '.join(bad)}")
sys.exit(1 if bad else 0)
PY
