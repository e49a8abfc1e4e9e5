#!/usr/bin/env bash
# torch_dump_bench.sh — stock PyTorch (workloads/torch_train.py) dumped and restored mid-run: under
# `pos run` with pos-cli dump --leave-running, and with a stop dump + pos-cli restore; each run's whole
# output must equal a native run's (losses and checksum), else exit 1. Then the same script run
# natively under NVIDIA's driver checkpoint + CRIU. Prints a table (docs/BENCHMARKS.md). The gpu suite
# runs it small (torch_dump_gpu); the bench runs it with --state-gib 8.
#
# --incremental: each POS dump is preceded by a pos-cli pre-dump (a GPU-only checkpoint) and takes it
# as --prev, so that it stores only what the job wrote since; the restore reads through the chain.
# --prev-dump: the same with a pos-cli dump --leave-running (a whole restore point, CPU part too) as
# --prev: the dump's CRIU part leaves the pages equal to that one's to it (compared by content:
# what a --with-cpu policy's points do), and CRIU's restore reads them through criu/parent.
#
# --lazy: the stop dump's image is restored a second time, with pos-cli restore --lazy (the job runs
# while its device memory loads); its output must equal the native run's too. --cold: the image's
# files are dropped from the page cache before each restore (as after a reboot, or on another host).
#
# Usage: bench/torch_dump_bench.sh BUILD [--at K] [--no-nvidia] [--incremental | --prev-dump] [--lazy] [--cold] [-- torch_train.py args...]
# Needs a GPU, PyTorch (python3) and CRIU (tools/install_criu.sh); run as root or the job's user.
set -uo pipefail
usage() { echo "usage: $0 BUILD [--at K] [--no-nvidia] [--incremental | --prev-dump] [--lazy] [--cold] [-- torch_train.py args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AT=20 NVIDIA=1 INC=0 LAZY=0 COLD=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --at) AT="${2:?}"; shift 2 ;;
    --no-nvidia) NVIDIA=0; shift ;;
    --incremental) INC=1; shift ;;
    --prev-dump) INC=1 PREV_DUMP=1; shift ;;
    --lazy) LAZY=1; shift ;;
    --cold) COLD=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 2 --dim 256 --steps 80)
TMP=$(mktemp -d /tmp/torch-dump.XXXXXX)
export POS_JOBS_DIR="$TMP/jobs"
CLI="$B/tools/pos-cli" POS="$B/tools/pos" CRIU="$ROOT/tools/criu"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
lines() { grep -c '^step ' "$1" 2>/dev/null || echo 0; }
json() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1" | head -1; }
# Until file $1 has step line $2 (at most 600 s).
wait_step() { for i in $(seq 1 12000); do grep -q "^step $2 loss" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
# Seconds from $3 until file $1 has more than $2 step lines; "ended" when the job finished without
# another step (the dump caught it after its last one: a small model runs hundreds of steps a second).
until_next_step() {
  local f=$1 n=$2 t0=$3
  for i in $(seq 1 60000); do
    [[ $(lines "$f") -gt $n ]] && { sub "$(now)" "$t0"; return; }
    grep -q '^checksum ' "$f" 2>/dev/null && { echo ended; return; }
    sleep 0.005
  done
  echo never
}
# Until file $1 has its checksum line (the run's end), at most 600 s.
wait_end() { for i in $(seq 1 12000); do grep -q '^checksum ' "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
gone() { for i in $(seq 1 4000); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.005; done; return 1; }
start() {  # start OUT PREFIX...: the job in the background, its pid in JOB
  local out=$1; shift
  "$@" python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" >"$out" 2>"$out.err" &
  JOB=$!; PIDS+=("$JOB")
}
FAIL=0
# The files under $1 dropped from the page cache (clean pages only: pos-cli fsyncs its images).
evict() { [[ $COLD == 1 ]] || return 0; find "$1" -type f -exec dd if={} iflag=nocache count=0 status=none \; ; }
# With --incremental: a pre-dump of job $JOB into $1, then step K+3 awaited in file $2; PREV names it.
PREV=() PRE_JSON=""
predump() {
  PREV=()
  [[ $INC == 1 ]] || return 0
  if [[ ${PREV_DUMP:-0} == 1 ]]; then
    PRE_JSON=$("$CLI" dump -t "$JOB" -D "$1" --leave-running --json) || { echo "dump --leave-running (the --prev) failed"; FAIL=1; return 0; }
  else
    PRE_JSON=$("$CLI" pre-dump -t "$JOB" -D "$1" --json) || { echo "pre-dump failed"; FAIL=1; return 0; }
  fi
  wait_step "$2" $((AT + 3))
  PREV=(--prev "$1")
}
same() {  # same NAME FILE: the file equals the native run's output
  if cmp -s "$TMP/ref.out" "$2"; then echo "$1: identical to the native run ($(lines "$2") steps, checksum)";
  else echo "$1: DIFFERS from the native run"; diff "$TMP/ref.out" "$2" | head -5; tail -5 "$2.err"; FAIL=1; fi
}

echo "== native reference"
python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" >"$TMP/ref.out" 2>"$TMP/ref.err" || { tail -5 "$TMP/ref.err"; exit 1; }
head -1 "$TMP/ref.out"

echo "== pos-cli dump --leave-running at step $AT"
start "$TMP/lr.out" "$POS" run --
wait_step "$TMP/lr.out" "$AT" || { echo "the job did not reach step $AT"; tail -5 "$TMP/lr.out.err"; exit 1; }
predump "$TMP/pre-lr" "$TMP/lr.out"
N=$(lines "$TMP/lr.out"); T0=$(now)
LR=$("$CLI" dump -t "$JOB" -D "$TMP/img-lr" --leave-running --json "${PREV[@]}") || { echo "dump --leave-running failed"; FAIL=1; N=-1; }
LR_BACK=$(until_next_step "$TMP/lr.out" "$N" "$T0")
echo "$LR"; echo "next step $LR_BACK s after the dump began"
wait "$JOB"; same "leave-running" "$TMP/lr.out"
du -sh "$TMP/img-lr/gpu" "$TMP/img-lr/criu" 2>/dev/null
rm -rf "$TMP/img-lr"

echo "== pos-cli dump (stop) at step $AT, then pos-cli restore"
start "$TMP/st.out" "$POS" run --
wait_step "$TMP/st.out" "$AT" || { echo "the job did not reach step $AT"; exit 1; }
predump "$TMP/pre-st" "$TMP/st.out"
T0=$(now)
RS="" RS_BACK=""
if ST=$("$CLI" dump -t "$JOB" -D "$TMP/img-stop" --json "${PREV[@]}"); then
  ST_S=$(sub "$(now)" "$T0")
  echo "$ST"
  gone "$JOB"; wait "$JOB" 2>/dev/null
  N=$(lines "$TMP/st.out")
  # A dump after the job's last step restores a job with nothing left to run: it proves little.
  if [[ $N -ge $(lines "$TMP/ref.out") ]]; then
    echo "the stop dump landed after the job's last step ($N of $(lines "$TMP/ref.out")): give it more --steps"; FAIL=1
  fi
  "$CLI" inspect "$TMP/img-stop" --summary | head -12
  # What the job had written when it was dumped: a second restore needs its files as they were then.
  cp "$TMP/st.out" "$TMP/st.dumped"; cp "$TMP/st.out.err" "$TMP/st.dumped.err"
  evict "$TMP/img-stop"
  T0=$(now)
  if RS=$("$CLI" restore -D "$TMP/img-stop" --json); then
    RS_BACK=$(until_next_step "$TMP/st.out" "$N" "$T0")
    echo "$RS"; echo "next step $RS_BACK s after the restore began"
    wait_end "$TMP/st.out"; same "stop + restore" "$TMP/st.out"
  else
    echo "restore failed"; FAIL=1
  fi
else
  echo "dump failed"; FAIL=1; ST_S=""
fi
du -sh "$TMP/img-stop/gpu" "$TMP/img-stop/criu" 2>/dev/null
kill -KILL "$(json "$RS" pid)" 2>/dev/null

RL="" RL_BACK=""
if [[ $LAZY == 1 && -n "$RS" ]]; then
  echo "== the same image restored again, with --lazy"
  gone "$(json "$RS" pid)"
  cp "$TMP/st.dumped" "$TMP/st.out"; cp "$TMP/st.dumped.err" "$TMP/st.out.err"
  evict "$TMP/img-stop"
  T0=$(now)
  # In the background: pos-cli stays until the load ends, and the job may step before that.
  "$CLI" restore -D "$TMP/img-stop" --lazy --json >"$TMP/rl.json" 2>"$TMP/rl.err" & RP=$!
  RL_BACK=$(until_next_step "$TMP/st.out" "$N" "$T0")
  if wait "$RP"; then
    RL=$(cat "$TMP/rl.json"); echo "$RL"; echo "next step $RL_BACK s after the restore began"
    grep -q '"loaded_while_running":true' <<<"$RL" || { echo "the restore did not load lazily"; FAIL=1; }
    wait_end "$TMP/st.out"; same "stop + restore --lazy" "$TMP/st.out"
  else
    echo "restore --lazy failed: $(cat "$TMP/rl.err")"; FAIL=1
  fi
  kill -KILL "$(json "$RL" pid)" 2>/dev/null
fi

NV_STOP="" NV_BACK="" NV_CKPT="" NV_CRIU_D="" NV_CRIU_R="" NV_RESTORE=""
if [[ $NVIDIA == 1 ]]; then
  echo "== NVIDIA: cuda checkpoint API + CRIU, the same script run natively, at step $AT"
  start "$TMP/nv.out" env
  wait_step "$TMP/nv.out" "$AT" || exit 1
  mkdir -p "$TMP/img-nv"; NJ=$JOB
  T0=$(now)
  C=$("$B/bench/nv_ckpt" "$NJ" --only checkpoint) && T1=$(now) &&
    "$CRIU" dump -t "$NJ" -D "$TMP/img-nv" -o dump.log --shell-job && NV_STOP=$(sub "$(now)" "$T0") &&
    NV_CKPT=$(sub "$T1" "$T0") && NV_CRIU_D=$(sub "$(now)" "$T1")
  if [[ -n "$NV_STOP" ]]; then
    gone "$NJ"; wait "$NJ" 2>/dev/null
    N=$(lines "$TMP/nv.out"); du -sh "$TMP/img-nv"
    T0=$(now)
    "$CRIU" restore -D "$TMP/img-nv" -o restore.log --shell-job --restore-detached && T1=$(now) &&
      R=$("$B/bench/nv_ckpt" "$NJ" --only restore) && NV_CRIU_R=$(sub "$T1" "$T0") &&
      NV_RESTORE=$(sub "$(now)" "$T1") && NV_BACK=$(until_next_step "$TMP/nv.out" "$N" "$T0")
    [[ -n "$NV_BACK" ]] || grep -h "Error" "$TMP/img-nv/restore.log" | head -5
    wait_end "$TMP/nv.out" && same "NVIDIA + CRIU" "$TMP/nv.out"
    kill -KILL "$NJ" 2>/dev/null
  else
    echo "$C"; grep -h "Error" "$TMP/img-nv/dump.log" 2>/dev/null | head -5
  fi
fi

echo
echo "| torch_train.py $(head -1 "$TMP/ref.out" | cut -d' ' -f2-) | POS (pos run) | NVIDIA API + CRIU |"
echo "|---|---|---|"
echo "| dump --leave-running: job paused (s) | $(json "$LR" pause_s) | — |"
echo "| — of which: device memory written (from the hold), driver checkpoint, CRIU, driver restore, hand-back or reload (s) | $(json "$LR" gpu_s), $(json "$LR" driver_s), $(json "$LR" criu_s), $(json "$LR" driver_restore_s), $(sub "$(json "$LR" resume_s)" "$(json "$LR" driver_restore_s)") | — |"
echo "| stop dump: job stopped until both parts are written (s) | $(json "$ST" stopped_s) (pos-cli's whole run $ST_S, with fsync $(json "$ST" sync_s)) | ${NV_STOP:-—} (driver ${NV_CKPT:-—}, CRIU ${NV_CRIU_D:-—}) |"
echo "| — of which: device memory written (from the hold, alongside the rest), driver checkpoint, CRIU (s) | $(json "$ST" gpu_s), $(json "$ST" driver_s), $(json "$ST" criu_s) | — |"
echo "| — inside the job: hold, export or copy to files, unmap (s) | $(json "$ST" detach_s), $(json "$ST" job_save_s), $(json "$ST" job_unmap_s) | — |"
echo "| device memory handed off (dump --leave-running, stop dump, restore) | $(sed -n 's/.*"handoff":\([a-z]*\).*/\1/p' <<<"$LR"), $(sed -n 's/.*"handoff":\([a-z]*\).*/\1/p' <<<"$ST"), $(sed -n 's/.*"handoff":\([a-z]*\).*/\1/p' <<<"$RS") | — |"
echo "| restore: back to its next step (s) | $RS_BACK (CRIU $(json "$RS" criu_s), driver $(json "$RS" reattach_s), hand-over $(json "$RS" gpu_s); pos-cli's load alongside $(json "$RS" load_s)) | ${NV_BACK:-—} (CRIU ${NV_CRIU_R:-—}, driver ${NV_RESTORE:-—}) |"
if [[ $LAZY == 1 ]]; then
  echo "| restore --lazy: running again / back to its next step / load done (s) | $(json "$RL" resumed_s) / $RL_BACK / $(json "$RL" total_s) (CRIU $(json "$RL" criu_s), driver $(json "$RL" reattach_s), hand-over $(json "$RL" gpu_s), pos-cli's load $(json "$RL" load_s)) | — |"
fi
[[ $COLD == 1 ]] && echo "| (both restores from a cold page cache: the image's files dropped first) | | |"
echo "| device memory saved by POS (bytes) / CRIU's part (bytes) | $(json "$ST" gpu_bytes) / $(json "$ST" criu_bytes) | — |"
if [[ $INC == 1 ]]; then
  echo "| --incremental: pre-dump stall (ms), its bytes; stored / left in the pre-dump by the dumps (leave-running, stop) | $(awk -v s="$(json "$PRE_JSON" gpu_stall_s)" 'BEGIN{printf "%.3f", s*1000}'), $(json "$PRE_JSON" gpu_bytes); $(json "$LR" gpu_bytes) / $(json "$LR" gpu_bytes_referenced), $(json "$ST" gpu_bytes) / $(json "$ST" gpu_bytes_referenced) | — |"
fi
if [[ ${PREV_DUMP:-0} == 1 ]]; then
  echo "| --prev-dump: CRIU's part of the --prev dump / of the stop dump (bytes); its pages left to the --prev's | $(json "$PRE_JSON" criu_bytes) / $(json "$ST" criu_bytes); $(json "$ST" criu_pages_to_parent) | — |"
  # The comparison must have happened, and the restore read through it.
  [[ $(json "$ST" criu_pages_to_parent) -gt 0 ]] 2>/dev/null || { echo "the stop dump left no page to its --prev"; FAIL=1; }
fi
echo
[[ $FAIL == 0 ]] && echo "all outputs identical to the native run" || echo "FAILED: see above"
exit $FAIL
