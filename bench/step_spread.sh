#!/usr/bin/env bash
# step_spread.sh — how a training job's step times spread on their own, natively and under posd, in
# turns, with the GPU's clocks, power and throttle reasons sampled alongside (issue #21: its
# worst-step target is judged against the job's median step, so the job's own spread, and whether
# POS or the GPU makes it, has to be known first).
#
# Usage: bench/step_spread.sh BUILD [--job mlp|torch] [--seconds N] [--rounds R]
#                              [--posd-cpus LIST --job-cpus LIST] [-- job args...]
# Each round runs mlp_train_native for N seconds natively, then N seconds under a posd of BUILD (CUDA
# backend); with --job torch, workloads/torch_train.py (default --layers 4 --state-gib 8) natively,
# then under `pos run` (the in-process driver runtime). Steps 0-9 of each run are left out. Prints
# one table: per run the step count, mean, median, p95, max / median, the share of steps above 1.2x
# the median, the SM clock (median, min) and power (mean, max) while it ran, the throttle reasons
# seen, and the correlation between a step's time and the SM clock sampled nearest its start. --posd-cpus / --job-cpus (taskset lists):
# posd (and its session processes) and the job on cores of their own, for another pair of runs
# per round ("pinned"; a torch job needs only --job-cpus). A second table says in which phase of the
# step the slow steps lost their time (for torch: making the batch, issuing the GPU work, waiting for
# it, and Python's garbage collector).
set -uo pipefail
usage() { echo "usage: $0 BUILD [--job mlp|torch] [--seconds N] [--rounds R] [--posd-cpus LIST --job-cpus LIST] [-- job args...]" >&2; exit 2; }
BUILD="${1:-}"; [[ -n "$BUILD" && -d "$BUILD" ]] || usage; shift
BUILD="$(cd "$BUILD" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_RUN=40 ROUNDS=2 POSD_CPUS="" JOB_CPUS="" JOB=mlp
while [[ $# -gt 0 ]]; do
  case "$1" in
    --job) JOB="${2:?}"; [[ $JOB == mlp || $JOB == torch ]] || usage; shift 2 ;;
    --seconds) SECONDS_PER_RUN="${2:?}"; [[ $SECONDS_PER_RUN =~ ^[1-9][0-9]*$ ]] || usage; shift 2 ;;
    --rounds) ROUNDS="${2:?}"; [[ $ROUNDS =~ ^[1-9]$ ]] || usage; shift 2 ;;
    --posd-cpus) POSD_CPUS="${2:?}"; [[ $POSD_CPUS =~ ^[0-9,-]+$ ]] || usage; shift 2 ;;
    --job-cpus) JOB_CPUS="${2:?}"; [[ $JOB_CPUS =~ ^[0-9,-]+$ ]] || usage; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ -z "$POSD_CPUS" && -z "$JOB_CPUS" || -n "$POSD_CPUS" && -n "$JOB_CPUS" || $JOB == torch && -z "$POSD_CPUS" ]] || usage
# The continuous-checkpointing bench's jobs (MLP: 8.84 GB, half the layers frozen; PyTorch: 12.2 GB).
if [[ ${#ARGS[@]} -eq 0 ]]; then
  if [[ $JOB == mlp ]]; then ARGS=(--input 1024 --hidden 16384 --layers 8 --output 256 --batch 256 --frozen 4)
  else ARGS=(--layers 4 --state-gib 8); fi
fi
ARGS+=(--steps 100000000 --step-times)
command -v nvidia-smi >/dev/null || { echo "step_spread: no nvidia-smi (a GPU machine is needed)" >&2; exit 2; }
TMP=$(mktemp -d)
POSD_PID="" PPOSD_PID="" SMI_PID=""
cleanup() {
  [[ -n "$SMI_PID" ]] && kill "$SMI_PID" 2>/dev/null
  [[ -n "$POSD_PID" ]] && kill -TERM "$POSD_PID" 2>/dev/null && wait "$POSD_PID" 2>/dev/null
  [[ -n "$PPOSD_PID" ]] && kill -TERM "$PPOSD_PID" 2>/dev/null && wait "$PPOSD_PID" 2>/dev/null
  [[ -n "${POS_BENCH_LOGS:-}" ]] && mkdir -p "$POS_BENCH_LOGS" && cp "$TMP"/*.err "$TMP"/*.csv "$POS_BENCH_LOGS"/ 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
SOCK="$TMP/posd.sock" PSOCK="$TMP/posd-pinned.sock" PPOSD_PID=""
start_posd() {  # $1: socket; the rest: a command prefix (taskset)
  local sock=$1; shift
  printf 'backend: cuda\nposd:\n  socket: %s\n' "$sock" >"$sock.yaml"
  "$@" "$BUILD/tools/posd" --config "$sock.yaml" 2>"$sock.log" &
  for _ in $(seq 1 200); do "$BUILD/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
}
if [[ $JOB == mlp ]]; then
  start_posd "$SOCK"; POSD_PID=$!
  if [[ -n "$POSD_CPUS" ]]; then start_posd "$PSOCK" taskset -c "$POSD_CPUS"; PPOSD_PID=$!; fi
  JOB_CMD=("$BUILD/workloads/mlp_train_native")
else
  JOB_CMD=(python3 "$ROOT/workloads/torch_train.py")
fi

run() {  # $1: name; the rest: env prefix
  local name=$1; shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 200 >"$TMP/$name.csv" 2>/dev/null &
  SMI_PID=$!
  "${JOB_PREFIX[@]}" env "$@" "${RUN_PREFIX[@]}" "${JOB_CMD[@]}" "${ARGS[@]}" </dev/null >/dev/null 2>"$TMP/$name.err" &
  local job=$!
  sleep "$SECONDS_PER_RUN"
  threads_cpu "$name" "$job" "$POSD_PID" "$PPOSD_PID" >"$TMP/$name.threads"
  kill -KILL "$job" 2>/dev/null; wait "$job" 2>/dev/null
  kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; SMI_PID=""
  echo "$name: $(grep -c '^step ' "$TMP/$name.err") steps" >&2
}
# The CPU time each thread of the job and of both posds (with their session processes) has used so
# far, the busiest first: a thread that spins or competes with the job's own shows here.
threads_cpu() {  # $1: run name; the rest: pids (empty ones skipped)
  local name=$1; shift
  local pids=() p
  for p in "$@"; do [[ -n "$p" ]] && pids+=("$p" $(pgrep -P "$p" 2>/dev/null)); done
  local hz; hz=$(getconf CLK_TCK)
  for p in "${pids[@]}"; do
    for t in /proc/"$p"/task/*; do
      [[ -r "$t/stat" ]] || continue
      # Fields after the ")" of comm: utime is the 12th, stime the 13th; the last CPU run on the 37th.
      awk -v hz="$hz" -v pid="$p" -v tid="${t##*/}" -v name="$name" '{
          i = index($0, ") "); comm = substr($0, index($0, "(") + 1, i - index($0, "(") - 1)
          split(substr($0, i + 2), f, " ")
          printf "%s %s/%s %s %.2f cpu%s\n", name, pid, tid, comm, (f[12] + f[13]) / hz, f[37] }' "$t/stat"
    done
  done | sort -k4,4 -g -r | head -12
}
NAMES=() JOB_PREFIX=() RUN_PREFIX=()
for ((r = 1; r <= ROUNDS; ++r)); do
  if [[ $JOB == torch ]]; then
    run "native-$r"; NAMES+=("native-$r")
    RUN_PREFIX=("$BUILD/tools/pos" run --); run "pos-run-$r"; NAMES+=("pos-run-$r"); RUN_PREFIX=()
    if [[ -n "$JOB_CPUS" ]]; then
      JOB_PREFIX=(taskset -c "$JOB_CPUS")
      run "native-pinned-$r"; NAMES+=("native-pinned-$r")
      RUN_PREFIX=("$BUILD/tools/pos" run --); run "pos-run-pinned-$r"; NAMES+=("pos-run-pinned-$r"); RUN_PREFIX=()
      JOB_PREFIX=()
    fi
    continue
  fi
  run "native-$r" LD_LIBRARY_PATH=/usr/local/cuda/lib64; NAMES+=("native-$r")
  run "posd-$r" POS_SOCKET="$SOCK" POS_JOB_NAME=spread LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
    LD_PRELOAD="$BUILD/remoting/client/libpos_client.so"; NAMES+=("posd-$r")
  if [[ -n "$POSD_CPUS" ]]; then
    JOB_PREFIX=(taskset -c "$JOB_CPUS")
    run "native-pinned-$r" LD_LIBRARY_PATH=/usr/local/cuda/lib64; NAMES+=("native-pinned-$r")
    run "posd-pinned-$r" POS_SOCKET="$PSOCK" POS_JOB_NAME=spread LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
      LD_PRELOAD="$BUILD/remoting/client/libpos_client.so"; NAMES+=("posd-pinned-$r")
    JOB_PREFIX=()
  fi
done

echo
echo "job: ${JOB_CMD[*]##*/} ${ARGS[*]}; ${SECONDS_PER_RUN} s a run, in turns"
python3 - "$TMP" "${NAMES[@]}" <<'EOF'
import sys, datetime, statistics as st
tmp, names = sys.argv[1], sys.argv[2:]

def read_steps(path):
    """(wall start s, ms) of each step from 10 on: mlp_train's "step N time_ms X ... wall_s T" lines,
    or torch_train.py's "step N start_s T" (a step lasts until the next one starts)."""
    steps, starts = [], []
    for line in open(path):
        f = line.split()
        if len(f) >= 10 and f[0] == "step" and f[2] == "time_ms" and int(f[1]) >= 10:
            steps.append((float(f[9]), float(f[3])))
        elif len(f) == 4 and f[0] == "step" and f[2] == "start_s":
            starts.append((int(f[1]), float(f[3])))
    for (i, t), (j, u) in zip(starts, starts[1:]):
        if i >= 10 and j == i + 1:
            steps.append((t, 1000 * (u - t)))
    return steps

def read_phases(path):
    """(total ms, then each phase's ms) per step from 10 on, and the phases' names."""
    ph, names = [], ["gen", "issue", "wait"]
    for line in open(path):
        f = line.split()
        if len(f) >= 16 and f[0] == "step" and f[10] == "gen_ms" and int(f[1]) >= 10:
            ph.append((float(f[3]), float(f[11]), float(f[13]), float(f[15])))
        elif len(f) >= 11 and f[0] == "step" and f[2] == "phases" and int(f[1]) >= 10:
            names = ["batch", "issue", "wait", "gc"]
            v = [float(f[k]) for k in (4, 6, 8, 10)]
            ph.append((sum(v[:3]), *v))
    return ph, names
print("| run | steps | mean ms | median | p95 | max / median | steps > 1.2x median | SM MHz median (min) | power W mean (max) | throttle reasons | corr(step, SM clock) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for n in names:
    steps = read_steps(f"{tmp}/{n}.err")  # (wall start, ms)
    smi = []  # (unix time, sm MHz, power W, reasons)
    for line in open(f"{tmp}/{n}.csv"):
        c = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(c[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time, as stamped
            smi.append((t, float(c[1]), float(c[3]), c[5]))
        except (ValueError, IndexError):
            pass
    if len(steps) < 3:
        print(f"| {n} | {len(steps)} | - | - | - | - | - | - | - | - | - |")
        continue
    ms = sorted(s[1] for s in steps)
    med = st.median(ms)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    over = sum(1 for x in ms if x > 1.2 * med) / len(ms)
    clocks = [s[1] for s in smi] or [0]
    power = [s[2] for s in smi] or [0]
    reasons = sorted({s[3] for s in smi if s[3] not in ("0x0000000000000000", "")})
    corr = "-"
    if len(smi) > 3:
        pairs = []
        for t, x in steps:
            nearest = min(smi, key=lambda s: abs(s[0] - t))
            pairs.append((x, nearest[1]))
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        if st.pstdev(xs) > 0 and st.pstdev(ys) > 0:
            mx, my = st.mean(xs), st.mean(ys)
            corr = "%.2f" % (sum((a - mx) * (b - my) for a, b in pairs) / len(pairs) / st.pstdev(xs) / st.pstdev(ys))
    print(f"| {n} | {len(ms)} | {st.mean(ms):.2f} | {med:.2f} | {p95:.2f} | {ms[-1] / med:.2f} | {100 * over:.1f} % | "
          f"{st.median(clocks):.0f} ({min(clocks):.0f}) | {st.mean(power):.0f} ({max(power):.0f}) | "
          f"{' '.join(reasons) if reasons else 'none'} | {corr} |")
print()
print("Phases of a step (ms; the job's --step-times): mlp_train: host batch generation (the GPU idles),")
print("issuing the GPU work, waiting for it; torch_train.py: making the batch and copying it over,")
print("issuing, waiting, and the part of the step Python's garbage collector took. Medians, then the")
print("slow steps (> 1.1x the median) less those medians: where a slow step's extra time went.")
header = False
for n in names:
    ph, pn = read_phases(f"{tmp}/{n}.err")
    if len(ph) < 3:
        continue
    if not header:
        print("| run | " + " | ".join(f"{x} median" for x in pn) + " | slow steps | their extra: " +
              " | ".join(pn) + " |")
        print("|---" * (2 + 2 * len(pn)) + "|")
        header = True
    k = len(pn) + 1
    med = [st.median(p[i] for p in ph) for i in range(k)]
    slow = [p for p in ph if p[0] > 1.1 * med[0]]
    extra = [st.mean(p[i] for p in slow) - med[i] if slow else 0.0 for i in range(k)]
    print(f"| {n} | " + " | ".join(f"{m:.2f}" for m in med[1:]) + f" | {len(slow)} | " +
          " | ".join(f"{e:+.2f}" for e in extra[1:]) + " |")
print()
print("Busiest threads of each run (run, pid/tid, name, CPU seconds so far, last CPU):")
for n in names:
    try: print(open(f"{tmp}/{n}.threads").read().rstrip())
    except OSError: pass
EOF
