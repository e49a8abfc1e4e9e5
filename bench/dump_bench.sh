#!/usr/bin/env bash
# dump_bench.sh — `pos-cli dump --leave-running` of the training job under posd, mid-run: the
# job's pause and each phase (detach, GPU cut + drain, CRIU), as pos-cli's JSON report prints them.
#
# Usage: bench/dump_bench.sh BUILD [--backend cuda|host] [--mode sync|async] [--dir DIR] [-- job args...]
# Needs CRIU (tools/setup.sh) and root. The image goes to DIR (default: a temporary directory), removed after.
set -euo pipefail
usage() { echo "usage: $0 BUILD [--backend cuda|host] [--mode sync|async] [--dir DIR] [-- job args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
BACKEND=cuda MODE=async DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --mode) MODE="${2:?}"; shift 2 ;;
    --dir) DIR="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--steps 100000000)
TMP=$(mktemp -d)
[[ -n "$DIR" ]] || DIR="$TMP/image"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP" "$DIR"; }
trap cleanup EXIT
sock="$TMP/posd/posd.sock"
printf 'backend: %s\nlog_level: info\nposd:\n  socket: %s\n' "$BACKEND" "$sock" >"$TMP/posd.yaml"
[[ $BACKEND == host ]] && printf '  host_kernel_libraries: [%s]\n' "$B/workloads/libmlp_host_kernels.so" >>"$TMP/posd.yaml"
"$B/tools/posd" --config "$TMP/posd.yaml" 2>"$TMP/posd.log" &
PIDS+=($!)
for i in $(seq 1 300); do "$B/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
POS_SOCKET="$sock" POS_JOB_NAME=bench LD_LIBRARY_PATH=/usr/local/cuda/lib64 LD_PRELOAD="$B/remoting/client/libpos_client.so" \
  "$B/workloads/mlp_train_native" "${ARGS[@]}" </dev/null >"$TMP/job.out" 2>&1 &
JOB=$!
PIDS+=($JOB)
# Until the job's parameters are on the device and it trains.
for i in $(seq 1 600); do
  "$B/tools/pos-cli" ps --socket "$sock" --json 2>/dev/null | grep -q '"job":"bench"' && grep -q "^step 2 " "$TMP/job.out" && break
  sleep 0.1
done
"$B/tools/pos-cli" ps --socket "$sock"
"$B/tools/pos-cli" dump -t "$JOB" -D "$DIR" --leave-running --mode "$MODE" --json --socket "$sock"
du -sh "$DIR/gpu" "$DIR/criu" 2>/dev/null || true
sleep 1
kill -0 "$JOB" && echo "the job runs on after the dump: $(grep -c '^step ' "$TMP/job.out") steps so far"
