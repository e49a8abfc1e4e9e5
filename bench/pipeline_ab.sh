#!/usr/bin/env bash
# pipeline_ab.sh — builds of bench/pipeline_bench side by side in one run (A = baseline, B, C, …
# = candidates), taking turns A, B, …, A, B, … so drift on the machine hits all; prints one table.
#
# Usage: bench/pipeline_ab.sh A_BENCH B_BENCH [C_BENCH ...] [--runs N] [-- pipeline_bench args...]
set -euo pipefail
usage() { echo "usage: $0 A_BENCH B_BENCH [C_BENCH ...] [--runs N] [-- pipeline_bench args...]" >&2; exit 2; }
BINS=() RUNS=5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="${2:?}"; shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) BINS+=("$1"); shift ;;
  esac
done
[[ ${#BINS[@]} -ge 2 && ${#BINS[@]} -le 26 ]] || usage
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || usage
NAMES=(A B C D E F G H I J K L M N O P Q R S T U V W X Y Z)
for x in "${BINS[@]}"; do [[ -x "$x" ]] || { echo "pipeline_ab: $x is not an executable" >&2; exit 2; }; done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--calls 3000000 --paced 300000 --clients 1,4)

TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for ((i = 1; i <= RUNS; i++)); do
  for ((k = 0; k < ${#BINS[@]}; k++)); do
    side=${NAMES[$k]} bin=${BINS[$k]}
    # Table rows of pipeline_bench: | clients | per-client rate | total | p50 | p99 | p50 | p99 |
    "$bin" "${ARGS[@]}" | awk -v s="$side" -v r="$i" -F'|' '$2 ~ /^ *[0-9]+ *$/ {gsub(/ /, ""); print s, r, $2, $3, $4, $5, $6, $7, $8}' >>"$TMP/rows"
  done
done
echo "| build | run | clients | async calls/s per client (min) | all clients calls/s | flood p50 µs | flood p99 µs | one-in-flight p50 µs | one-in-flight p99 µs |"
echo "|---|---|---|---|---|---|---|---|---|"
sort -k3,3n -k1,1 -k2,2n "$TMP/rows" | awk '{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}'
echo
echo "| clients | build | median calls/s per client | min | max |"
echo "|---|---|---|---|---|"
for c in $(awk '{print $3}' "$TMP/rows" | sort -un); do
  for ((k = 0; k < ${#BINS[@]}; k++)); do
    side=${NAMES[$k]}
    awk -v c="$c" -v s="$side" '$3 == c && $1 == s {print $4}' "$TMP/rows" | sort -n |
      awk -v c="$c" -v s="$side" '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "| %s | %s | %.0f | %s | %s |\n", c, s, m, v[1], v[NR]}'
  done
done
