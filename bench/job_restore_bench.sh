#!/usr/bin/env bash
# job_restore_bench.sh — issue #19's bench in one run: the MLP job under posd dumped with
# --leave-running (its pause), dumped and restored (eager and --lazy: back to its next step), and the
# same program run natively through NVIDIA's driver checkpoint + CRIU (stop to dump, back to its next step).
#
# Usage: bench/job_restore_bench.sh BUILD [--dir DIR] [--backend cuda|host] [-- job args...]
# (root, CRIU from tools/setup.sh; --backend host tries the script without a GPU: no NVIDIA part)
# Images go under DIR (default: a temporary directory on local disk), removed after. Prints a table.
set -uo pipefail
usage() { echo "usage: $0 BUILD [--dir DIR] [-- job args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="" BACKEND=cuda
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) DIR="${2:?}"; shift 2 ;;
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
# Half the layers frozen (fine-tuning): what an incremental dump leaves in its --prev. --step-times:
# the job's own step gaps measure each dump's pause.
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--input 1024 --hidden 16384 --layers 8 --output 256 --batch 256 --frozen 4 --steps 100000000 --step-times)
# Restored trees are reparented to the nearest child subreaper: this shell, so that it reaps them
# (a zombie would keep its pid, and the next restore needs that pid).
if [[ -z "${POS_BENCH_SUBREAPER:-}" ]]; then
  export POS_BENCH_SUBREAPER=1
  exec python3 -c 'import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execvp("bash", ["bash"] + sys.argv[1:])' "$0" "$B" ${DIR:+--dir "$DIR"} --backend "$BACKEND" -- "${ARGS[@]}"
fi
CRIU="$ROOT/tools/criu"
TMP=$(mktemp -d)
[[ -n "$DIR" ]] || DIR="$TMP"
mkdir -p "$DIR"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP" "$DIR"/img-*; }
trap cleanup EXIT
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
lines() { grep -c '^step ' "$1" 2>/dev/null || echo 0; }
# Seconds until file $1 has more than $2 step lines (its next step after a restore), at most 120 s.
until_next_step() {
  local f=$1 n=$2 t0=$3
  for i in $(seq 1 24000); do [[ $(lines "$f") -gt $n ]] && break; sleep 0.005; done
  sub "$(now)" "$t0"
}
gone() { for i in $(seq 1 2000); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.005; done; return 1; }
json() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1"; }
# The job's longest step-to-step gap (ms, from one step's start to the next's) after step line $2
# of file $1, and its median gap before: a dump's pause as the job sees it is the longest gap
# minus a usual one.
step_gap() {
  # Waits for steps after line $3 (the count when the command returned): a gap ends only once the
  # job runs again, which may be after the command returned (a restore) or just before it.
  local f=$1 from=$2 after=${3:-$2} max med
  local ok=no
  for i in $(seq 1 400); do [[ $(steps_so_far "$f") -gt $((after + 3)) ]] && ok=yes && break; sleep 0.05; done
  # A job that did not step on has no gap to report (it died, or never came back).
  if [[ $ok == no ]]; then echo "the job made no steps after the command: $(tail -2 "$f")" >&2; echo "nan nan"; return; fi
  max=$(grep '^step .* start_s' "$f" | tail -n +$((from > 0 ? from : 1)) |
        awk '{ if (NR > 1 && ($6 - p) * 1000 > m) m = ($6 - p) * 1000; p = $6 } END { printf "%.1f", m }')
  med=$(grep '^step .* start_s' "$f" | head -n "$from" | awk 'NR > 1 { print ($6 - p) * 1000 } { p = $6 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) printf "%.1f", a[int((NR + 1) / 2)]; else printf "0" }')
  echo "$max $med"
}
# Removes images, then waits until the file system is done with it: deleting gigabytes stalls
# every writer on that file system for seconds, the job's own output included, and the next phase
# must not measure that.
settle() {
  rm -rf "$@"; sync
  local n; n=$(steps_so_far "$TMP/job.out.err" 2>/dev/null || echo 0)
  for i in $(seq 1 200); do [[ $(steps_so_far "$TMP/job.out.err") -gt $((n + 3)) ]] && break; sleep 0.05; done
}
steps_so_far() { grep -c '^step .* time_ms' "$1"; }

sock="$TMP/posd/posd.sock"
printf 'backend: %s\nlog_level: info\nposd:\n  socket: %s\n' "$BACKEND" "$sock" >"$TMP/posd.yaml"
[[ $BACKEND == host ]] && printf '  host_kernel_libraries: [%s]\n' "$B/workloads/libmlp_host_kernels.so" >>"$TMP/posd.yaml"
"$B/tools/posd" --config "$TMP/posd.yaml" 2>"$TMP/posd.log" &
PIDS+=($!)
for i in $(seq 1 300); do "$B/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
start_job() {  # $1: output file; the rest: env prefix ("" for native)
  local out=$1; shift
  env "$@" "$B/workloads/mlp_train_native" "${ARGS[@]}" </dev/null >"$out" 2>"$out.err" &
  JOB=$!
  PIDS+=($JOB)
  for i in $(seq 1 1200); do grep -q "^step 2 " "$out" && return 0; sleep 0.1; done
  echo "the job did not reach step 2: $(tail -3 "$out.err")" >&2; return 1
}
POSENV=(POS_SOCKET="$sock" POS_JOB_NAME=bench LD_LIBRARY_PATH=/usr/local/cuda/lib64 LD_PRELOAD="$B/remoting/client/libpos_client.so")

echo "== POS: pos-cli dump --leave-running --mode async"
start_job "$TMP/job.out" "${POSENV[@]}" || exit 1
"$B/tools/pos-cli" ps --socket "$sock"
S0=$(steps_so_far "$TMP/job.out.err")
LR=$("$B/tools/pos-cli" dump -t "$JOB" -D "$DIR/img-lr" --leave-running --mode async --json --socket "$sock")
echo "$LR"
read -r LR_MAX LR_MED <<<"$(step_gap "$TMP/job.out.err" "$S0" "$(steps_so_far "$TMP/job.out.err")")"
echo "job's steps: longest around the dump $LR_MAX ms, median before $LR_MED ms"
du -sh "$DIR/img-lr/gpu" "$DIR/img-lr/criu" 2>/dev/null
settle "$DIR/img-lr"  # disk room for the next images
GPU_BYTES=$(json "$LR" gpu_bytes)

echo "== POS: pos-cli pre-dump, then dump --leave-running --prev (CRIU dirty-memory tracking: $("$CRIU" check --feature mem_dirty_track >/dev/null 2>&1 && echo yes || echo no))"
S0=$(steps_so_far "$TMP/job.out.err")
PRE=$("$B/tools/pos-cli" pre-dump -t "$JOB" -D "$DIR/img-pre" --json --socket "$sock")
echo "$PRE"
read -r PRE_MAX PRE_MED <<<"$(step_gap "$TMP/job.out.err" "$S0" "$(steps_so_far "$TMP/job.out.err")")"
sleep 2  # the job trains on: what the next dump saves is what these steps changed
S0=$(steps_so_far "$TMP/job.out.err")
INC=$("$B/tools/pos-cli" dump -t "$JOB" -D "$DIR/img-inc" --prev "$DIR/img-pre" --leave-running --mode async --json --socket "$sock")
echo "$INC"
read -r INC_MAX INC_MED <<<"$(step_gap "$TMP/job.out.err" "$S0" "$(steps_so_far "$TMP/job.out.err")")"
echo "job's steps: pre-dump longest $PRE_MAX ms; dump --prev longest $INC_MAX ms (median $INC_MED ms)"
"$B/tools/pos-cli" inspect --summary --no-verify "$DIR/img-inc" | grep -E "stored|pages|process tree" -A1 | head -12
settle "$DIR/img-pre" "$DIR/img-inc"

echo "== POS: pos-cli dump (the job ends), then restore, eager and --lazy"
T0=$(now)
D=$("$B/tools/pos-cli" dump -t "$JOB" -D "$DIR/img-stop" --mode async --json --socket "$sock")
DUMP_S=$(sub "$(now)" "$T0")
echo "$D"
gone "$JOB"; wait "$JOB" 2>/dev/null
SIZE=$(stat -c %s "$TMP/job.out"); ESIZE=$(stat -c %s "$TMP/job.out.err"); N=$(lines "$TMP/job.out")
declare -A BACK RS
for how in eager lazy; do
  truncate -s "$SIZE" "$TMP/job.out"  # CRIU restores open files at their size at the dump
  truncate -s "$ESIZE" "$TMP/job.out.err"
  flag=""; [[ $how == lazy ]] && flag="--lazy"
  T0=$(now)
  RS[$how]=$("$B/tools/pos-cli" restore -D "$DIR/img-stop" $flag --json --socket "$sock") || { echo "restore ($how) failed"; continue; }
  BACK[$how]=$(until_next_step "$TMP/job.out" "$N" "$T0")
  echo "${RS[$how]}"
  echo "$how: back to its next step in ${BACK[$how]} s"
  kill -KILL "$JOB" 2>/dev/null; gone "$JOB"; sleep 0.5
done
tail -3 "$TMP/posd.log"

echo "== NVIDIA: cuda checkpoint API + CRIU on the same program run natively"
NV_STOP="" NV_BACK="" NV_CKPT="" NV_CRIU_D="" NV_CRIU_R="" NV_RESTORE=""
if [[ $BACKEND == cuda ]] && start_job "$TMP/nv.out" LD_LIBRARY_PATH=/usr/local/cuda/lib64; then
  NJ=$JOB
  mkdir -p "$DIR/img-nv"
  T0=$(now)
  C=$("$B/bench/nv_ckpt" "$NJ" --only checkpoint) && echo "$C" &&
  T1=$(now) && "$CRIU" dump -t "$NJ" -D "$DIR/img-nv" -o dump.log --shell-job -v4 && NV_STOP=$(sub "$(now)" "$T0") &&
    NV_CKPT=$(sub "$T1" "$T0") && NV_CRIU_D=$(sub "$(now)" "$T1")
  if [[ -n "$NV_STOP" ]]; then
    gone "$NJ"; wait "$NJ" 2>/dev/null
    N2=$(lines "$TMP/nv.out")
    du -sh "$DIR/img-nv"
    T0=$(now)
    "$CRIU" restore -D "$DIR/img-nv" -o restore.log --shell-job --restore-detached -v4 && T1=$(now) &&
      R=$("$B/bench/nv_ckpt" "$NJ" --only restore) && echo "$R" && NV_CRIU_R=$(sub "$T1" "$T0") &&
      NV_RESTORE=$(sub "$(now)" "$T1") && NV_BACK=$(until_next_step "$TMP/nv.out" "$N2" "$T0")
    [[ -n "$NV_BACK" ]] || grep -h "Error" "$DIR/img-nv/restore.log" | head -5
    kill -KILL "$NJ" 2>/dev/null
  else
    grep -h "Error" "$DIR/img-nv/dump.log" 2>/dev/null | head -5
  fi
fi

echo
echo "| | POS | NVIDIA API + CRIU |"
echo "|---|---|---|"
echo "| device state | $GPU_BYTES bytes (job's buffers) | whole process |"
echo "| job paused by a dump that leaves it running (pos-cli's pause_s; the job's longest step - median step) | $(json "$LR" pause_s) s; $LR_MAX - $LR_MED ms | — (not offered) |"
echo "| the same after a pre-dump (dump --prev; GPU bytes stored / left in the pre-dump; CRIU bytes) | $(json "$INC" pause_s) s; $INC_MAX - $INC_MED ms ($(json "$INC" gpu_bytes) / $(json "$INC" gpu_bytes_referenced); $(json "$INC" criu_bytes)) | — |"
echo "| pre-dump itself (the job's longest step) | $PRE_MAX ms | — |"
echo "| stop and dump (the job ends) | $DUMP_S s | ${NV_STOP:-failed} s (checkpoint ${NV_CKPT:-?} + CRIU ${NV_CRIU_D:-?}) |"
echo "| restore, back to the next step (eager) | ${BACK[eager]:-failed} s | ${NV_BACK:-failed} s (CRIU ${NV_CRIU_R:-?} + restore ${NV_RESTORE:-?}) |"
echo "| restore, back to the next step (--lazy) | ${BACK[lazy]:-failed} s | — |"
