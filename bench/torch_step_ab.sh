#!/usr/bin/env bash
# torch_step_ab.sh — stock PyTorch natively and under `pos run`, alternating runs: the median step
# time of each (steps after the first WARM, from torch_train.py --step-times), the ratio, and whether
# the two print the same losses and checksum. Prints a table (docs/BENCHMARKS.md).
#
# Usage: bench/torch_step_ab.sh BUILD [--runs N] [--warm K] [--policy T] [-- torch_train.py args...]
#   --policy T   a third arm: pos run --checkpoint-every T (GPU state only, into a temporary
#                directory), with the mean step beside the median (a tick's cost shows in the mean)
set -uo pipefail
usage() { echo "usage: $0 BUILD [--runs N] [--warm K] [--policy T] [-- torch_train.py args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=5 WARM=5 POLICY=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="${2:?}"; shift 2 ;;
    --warm) WARM="${2:?}"; shift 2 ;;
    --policy) POLICY="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 8 --dim 1024 --heads 16 --seq 512 --batch 16 --vocab 8192 --steps 40)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# One run: stdout to $1.out, the median of its step-to-step gaps after WARM steps (ms) on stdout.
one() {
  local tag=$1; shift
  "$@" python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" --step-times >"$TMP/$tag.out" 2>"$TMP/$tag.err" ||
    { echo "run $tag failed: $(tail -3 "$TMP/$tag.err")" >&2; echo nan; return; }
  grep '^step .* start_s' "$TMP/$tag.err" | awk -v w="$WARM" 'NR > w + 1 { print ($4 - p) * 1000 } { p = $4 }' |
    sort -g | awk '{ a[NR] = $1; s += $1 } END { if (NR) printf "%.3f", a[int((NR + 1) / 2)]; else print "nan"; if (NR) printf "%.3f\n", s / NR > "/dev/stderr" }' 2>>"$TMP/means.$tag"
}
mean_of() { cat "$TMP"/means.$1* 2>/dev/null | awk '{ s += $1 } END { if (NR) printf "%.3f", s / NR; else print "nan" }'; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { printf "%.3f", a[int((NR + 1) / 2)] }'; }
N="" P=""
for i in $(seq 1 "$RUNS"); do
  N="$N $(one native$i env)"
  P="$P $(one pos$i "$B/tools/pos" run --census "$TMP/census$i.json" --)"
  [[ -n "$POLICY" ]] && C="${C:-} $(one policy$i "$B/tools/pos" run --checkpoint-every "$POLICY" -D "$TMP/points$i" --keep 1 --full-every 3 --)"
  # What the policy did in that run: restore points taken and the job's pause in each (ms).
  [[ -n "$POLICY" ]] && cat "$TMP/points$i/checkpoint.log" 2>/dev/null | sed -n 's/.*the job paused \([0-9.]*\) ms.*/\1/p' >>"$TMP/pauses"
  [[ -n "$POLICY" ]] && TAKEN="${TAKEN:-} $(grep -c 'the job paused' "$TMP/points$i/checkpoint.log" 2>/dev/null || echo 0)"
  rm -rf "$TMP/points$i"
done
mn=$(echo "$N" | median) mp=$(echo "$P" | median)
same=no; cmp -s "$TMP/native1.out" "$TMP/pos1.out" && same=yes
echo "model: $(head -1 "$TMP/native1.out")"
echo "census of the last run under pos run: $(head -c 600 "$TMP/census$RUNS.json")"
echo
echo "| | native | pos run | pos / native |"
echo "|---|---|---|---|"
echo "| step time, median of $RUNS runs' medians (ms) | $mn | $mp | $(awk -v a="$mp" -v b="$mn" 'BEGIN { printf "%.3f", a / b }') |"
echo "| each run's median (ms) |$N |$P | |"
echo "| losses and checksum identical | | $same | |"
if [[ -n "$POLICY" ]]; then
  mc=$(echo "$C" | median)
  samec=no; cmp -s "$TMP/native1.out" "$TMP/policy1.out" && samec=yes
  echo
  echo "| | pos run | pos run --checkpoint-every $POLICY | policy / pos run |"
  echo "|---|---|---|---|"
  echo "| step time, median of $RUNS runs' medians (ms) | $mp | $mc | $(awk -v a="$mc" -v b="$mp" 'BEGIN { printf "%.4f", a / b }') |"
  echo "| step time, mean over runs (ms) | $(mean_of pos) | $(mean_of policy) | $(awk -v a="$(mean_of policy)" -v b="$(mean_of pos)" 'BEGIN { printf "%.4f", a / b }') |"
  echo "| each run's median (ms) |$P |$C | |"
  echo "| losses and checksum identical to native | | $samec | |"
  echo "| restore points taken in each run | |${TAKEN:-} | |"
  echo "| the job's pause per point, mean / max (ms) | | $(awk '{ s += $1; if ($1 > m) m = $1 } END { if (NR) printf "%.2f / %.2f", s / NR, m; else print "-" }' "$TMP/pauses" 2>/dev/null) | |"
fi
