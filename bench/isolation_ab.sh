#!/usr/bin/env bash
# isolation_ab.sh — what posd.isolation costs: one build, the same jobs natively, under a posd with
# `isolation: shared` and under one with `isolation: process`, taking turns in one run; one table.
#
# Usage: bench/isolation_ab.sh BUILD [--runs N] [--backend cuda|host] [--steps N]
# Rows: a synchronous call's round trip and a launch's cost to the app (remoting_bench), the MLP's
# step time (mlp_train_native), a job's start to exit with 1 step (session set-up included), and 4
# jobs at once (steps per second of all four together).
set -euo pipefail
usage() { echo "usage: $0 BUILD [--runs N] [--backend cuda|host] [--steps N]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
RUNS=5 BACKEND=cuda STEPS=300
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="${2:?}"; shift 2 ;;
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --steps) STEPS="${2:?}"; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ && "$STEPS" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$BACKEND" == cuda || "$BACKEND" == host ]] || usage
JOB="$B/workloads/mlp_train_native" RB="$B/bench/remoting_bench" LIB="$B/remoting/client/libpos_client.so"
for f in "$JOB" "$B/tools/posd" "$LIB"; do [[ -e "$f" ]] || { echo "isolation_ab: $f missing" >&2; exit 2; }; done
CUDA_LIB=/usr/local/cuda/lib64
TMP=$(mktemp -d)
PIDS=()
cleanup() { [[ -n "${KEEP:-}" ]] && cp "$TMP/rows" "$KEEP";  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
MODES=(shared process)
for m in "${MODES[@]}"; do
  mkdir -p "$TMP/$m"
  sock="$TMP/$m/posd.sock" cfg="$TMP/$m.yaml"
  printf 'backend: %s\nposd:\n  socket: %s\n  isolation: %s\n' "$BACKEND" "$sock" "$m" >"$cfg"
  [[ $BACKEND == host ]] && printf '  host_kernel_libraries: [%s]\n' "$B/workloads/libmlp_host_kernels.so" >>"$cfg"
  "$B/tools/posd" --config "$cfg" 2>"$TMP/$m.log" &
  PIDS+=($!)
  for i in $(seq 1 300); do "$B/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
  "$B/tools/pos-cli" ps --socket "$sock" >/dev/null || { echo "isolation_ab: posd ($m) did not come up:" >&2; cat "$TMP/$m.log" >&2; exit 1; }
done

# run MODE CMD...: natively or under that mode's posd.
run() {
  local m=$1; shift
  if [[ $m == native ]]; then LD_LIBRARY_PATH=$CUDA_LIB "$@"
  else POS_SOCKET="$TMP/$m/posd.sock" LD_LIBRARY_PATH=$CUDA_LIB LD_PRELOAD="$LIB" "$@"; fi
}
now() { date +%s.%N; }
row() { echo "$1 $2 $3" >>"$TMP/rows"; }  # metric mode value
# Natively the job needs a GPU: with the host backend only the two posds are compared.
ALL=("${MODES[@]}")
[[ $BACKEND == cuda ]] && ALL=(native "${MODES[@]}")
for ((i = 1; i <= RUNS; i++)); do
  for m in "${ALL[@]}"; do
    if [[ -x "$RB" ]]; then
      out=$(run "$m" "$RB" 64 2>/dev/null) || { echo "isolation_ab: remoting_bench failed ($m)" >&2; exit 1; }
      row sync_roundtrip_us "$m" "$(sed -n 's/^sync_roundtrip_p50_us //p' <<<"$out")"
      row launch_us "$m" "$(sed -n 's/^launch_burst256_us_p50 //p' <<<"$out")"
    fi
    t=$(run "$m" "$JOB" --steps "$STEPS" 2>&1 >/dev/null | sed -n 's/.*mean step time \([0-9.]*\) ms.*/\1/p')
    row step_ms "$m" "$t"
    t0=$(now); run "$m" "$JOB" --steps 1 >/dev/null 2>&1; t1=$(now)
    row job_start_to_exit_s "$m" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')"
    t0=$(now)
    jobs=()
    for k in 1 2 3 4; do run "$m" "$JOB" --steps "$STEPS" >/dev/null 2>&1 & jobs+=($!); done
    for j in "${jobs[@]}"; do wait "$j" || { echo "isolation_ab: a concurrent job failed ($m)" >&2; exit 1; }; done
    t1=$(now)
    row four_jobs_steps_per_s "$m" "$(awk -v a="$t0" -v b="$t1" -v n="$STEPS" 'BEGIN{print 4*n/(b-a)}')"
  done
done

median() { sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
printf '%-24s %12s %12s %12s %14s %16s\n' metric native shared process process/shared process/native
for metric in sync_roundtrip_us launch_us step_ms job_start_to_exit_s four_jobs_steps_per_s; do
  grep -q "^$metric " "$TMP/rows" || continue
  n=$(awk -v k=$metric '$1==k && $2=="native"{print $3}' "$TMP/rows" | median)
  [[ -n "$n" ]] || n=0
  s=$(awk -v k=$metric '$1==k && $2=="shared"{print $3}' "$TMP/rows" | median)
  p=$(awk -v k=$metric '$1==k && $2=="process"{print $3}' "$TMP/rows" | median)
  awk -v k="$metric" -v n="$n" -v s="$s" -v p="$p" \
    'BEGIN{printf "%-24s %12.3f %12.3f %12.3f %14.3f %16s\n", k, n, s, p, p/s, (n>0 ? sprintf("%.3f", p/n) : "-")}'
done
echo "($RUNS runs each, medians; $BACKEND backend; mlp_train_native --steps $STEPS; 4 jobs = 4 processes at once)"
