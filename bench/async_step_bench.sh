#!/usr/bin/env bash
# async_step_bench.sh — training step time while an async checkpoint drains: runs mlp_train_pos
# twice (plain, then with POS_CHECKPOINT mode=async;then=continue) and prints a table of step times.
#
# usage: bench/async_step_bench.sh [--build DIR] [--backend cuda|host] [--steps N] [--at K]
#                                  [--dir DIR] [--logs DIR] [-- MODEL ARGS...]
#   --build    meson build directory holding workloads/mlp_train_pos (default: $ROOT/build)
#   --backend  POS_BACKEND for both runs (default cuda)
#   --steps    training steps (default 60); --at: checkpoint after sync call K = after step K (default 10)
#   --dir      where the image goes (default: /dev/shm when it has room — a memory-speed target —
#              else $POS_CKPT_DIR or $ROOT/.ckpt-bench); removed afterwards
#   --logs     keep both runs' stdout/stderr there (default: a temporary directory, removed)
#   MODEL ARGS default to ~9.5 GB of parameters: --input 1024 --hidden 16384 --layers 8 --output 256 --batch 256
# Both runs must print the same losses and checksum (an async checkpoint may not change results):
# otherwise, or if a run fails, the script exits 1. Step K's line is "step K time_ms X start_s A end_s B"
# (--step-times); the drain window is the runtime's "pos: drain of checkpoint 1 ran from S to E s" line,
# both on the monotonic clock. A step overlaps the drain when it ends after S and starts before E; the
# step whose synchronization took the cut (its stall included) is one of them.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"; BACKEND=cuda; STEPS=60; AT=10; DIR=""; LOGS=""
MODEL=(--input 1024 --hidden 16384 --layers 8 --output 256 --batch 256)
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --at) AT="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --logs) LOGS="$2"; shift 2 ;;
    --) shift; MODEL=("$@"); break ;;
    *) echo "async_step_bench: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
EXE="$BUILD/workloads/mlp_train_pos"
[[ -x "$EXE" ]] || { echo "async_step_bench: $EXE not found (build with nvcc available)" >&2; exit 2; }
if [[ ! "$AT" =~ ^[1-9][0-9]*$ || ! "$STEPS" =~ ^[0-9]+$ || "$AT" -ge "$STEPS" ]]; then
  echo "async_step_bench: need 1 <= --at < --steps" >&2; exit 2
fi

if [[ -n "$LOGS" ]]; then mkdir -p "$LOGS"; else LOGS="$(mktemp -d)"; trap 'rm -rf "$LOGS"' EXIT; fi
ARGS=("${MODEL[@]}" --steps "$STEPS" --step-times)

echo "== plain: POS_BACKEND=$BACKEND mlp_train_pos ${ARGS[*]}"
POS_BACKEND="$BACKEND" timeout 300 "$EXE" "${ARGS[@]}" >"$LOGS/plain.out" 2>"$LOGS/plain.err"
rc=$?; [[ $rc -eq 0 ]] || { echo "plain run failed (exit $rc):"; tail -5 "$LOGS/plain.err"; exit 1; }

# The image holds every device buffer: the parameters, one layer's gradient, activations; room for
# 1.25 x the parameters + 1 GiB is plenty.
PARAM_MIB=$(sed -n 's/.*params [0-9]* (\([0-9.]*\) MiB).*/\1/p' "$LOGS/plain.err" | head -1)
NEED_KIB=$(awk -v m="${PARAM_MIB:-0}" 'BEGIN{printf "%d", (m * 1.25 + 1024) * 1024}')
if [[ -z "$DIR" ]]; then
  SHM_KIB=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2{print $4}')
  if [[ -n "$SHM_KIB" && "$SHM_KIB" -gt "$NEED_KIB" ]]; then DIR=/dev/shm; else DIR="${POS_CKPT_DIR:-$ROOT/.ckpt-bench}"; fi
fi
mkdir -p "$DIR"
WORK="$(mktemp -d "$DIR/async-step-XXXXXX")"
echo "image target: $WORK ($(df -PT "$WORK" | awk 'NR==2{print $2}'), $((NEED_KIB / 1048576)) GiB needed at most)"

SPEC="at=$AT;mode=async;dir=$WORK/img;then=continue"
echo "== checkpointed: POS_CHECKPOINT=\"$SPEC\""
POS_BACKEND="$BACKEND" POS_CHECKPOINT="$SPEC" timeout 300 "$EXE" "${ARGS[@]}" >"$LOGS/ckpt.out" 2>"$LOGS/ckpt.err"
rc=$?
rm -rf "$WORK"
[[ $rc -eq 0 ]] || { echo "checkpointed run failed (exit $rc):"; tail -5 "$LOGS/ckpt.err"; exit 1; }
if ! cmp -s "$LOGS/plain.out" "$LOGS/ckpt.out"; then
  echo "the checkpointed run printed other losses or another checksum than the plain run:"
  diff "$LOGS/plain.out" "$LOGS/ckpt.out" | head -10
  exit 1
fi
echo "losses and checksum: identical in both runs"
grep -E '^pos: (checkpoint|drain)' "$LOGS/ckpt.err"

awk -v steps="$STEPS" '
  # Step 0 includes lazy module loading and warm-up: left out of every figure.
  FNR == 1 { run++ }
  run == 1 && $1 == "step" && $3 == "time_ms" && $2 > 0 { pn++; ps += $4; if ($4 > pm) pm = $4 }
  run == 2 && $1 == "step" && $3 == "time_ms" { t[$2] = $4; s[$2] = $6; e[$2] = $8; n2++ }
  run == 2 && /^pos: drain of checkpoint/ { ds = $8; de = $10 }
  run == 2 && /^pos: checkpoint 1 at/ { for (i = 1; i <= NF; i++) { if ($i == "stall") stall = $(i + 1); if ($i == "stored,") stored = $(i - 2) } }
  END {
    if (pn == 0 || n2 == 0) { print "no step lines found (is --step-times supported?)"; exit 1 }
    if (ds == "") { print "no drain line found in the checkpointed run"; exit 1 }
    last = -1
    for (k = 1; k < steps; k++) {
      if (!(k in t)) continue
      if (e[k] > ds && s[k] < de) { on++; os += t[k]; if (t[k] > om) om = t[k] }
      else { off++; fs += t[k]; if (t[k] > fm) fm = t[k] }
      if (e[k] > last) last = e[k]
    }
    pmean = ps / pn
    printf "\n| run | steps | mean step ms | max step ms |\n|---|---|---|---|\n"
    printf "| no checkpoint (steps 1..%d) | %d | %.3f | %.3f |\n", steps - 1, pn, pmean, pm
    if (off > 0) printf "| checkpointed, steps outside the drain | %d | %.3f | %.3f |\n", off, fs / off, fm
    else printf "| checkpointed, steps outside the drain | 0 | - | - |\n"
    if (on > 0) printf "| checkpointed, steps overlapping the drain | %d | %.3f | %.3f |\n", on, os / on, om
    else printf "| checkpointed, steps overlapping the drain | 0 | - | - |\n"
    dms = (de - ds) * 1e3
    printf "\ndrain %.1f ms for %s bytes (%.2f GB/s), stall at the cut %s ms\n", dms, stored, (dms > 0) ? stored / dms / 1e6 : 0, stall
    if (on > 0) printf "slowdown (mean overlapping step / mean step without checkpoint): %.3f; max overlapping step / mean: %.3f\n", os / on / pmean, om / pmean
    else print "slowdown: no training step overlapped the drain"
    if (de > last) print "note: the drain outlasted the training steps (it ended during the checksum); raise --steps to see its whole effect"
  }' "$LOGS/plain.err" "$LOGS/ckpt.err"
