#!/usr/bin/env bash
# gpu_run.sh — everything issue #3 proves on a GPU machine, in one call: build there, run the CI suites
# and the `gpu` suite, then the GPU benches (native vs POS side by side). Results under $OUT.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/device-out}"
B="${POS_GPU_BUILD:-/tmp/pos-build}"
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
QUICK=0; [[ "${1:-}" == "--quick" ]] && QUICK=1   # tests only, no benches
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: ${POS_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "cores: $(nproc)"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  g++ --version | head -1; nvcc --version | tail -2 | head -1
} | tee "$OUT/machine.txt"
if [[ ! -f "$B/build.ninja" ]]; then
  meson setup "$B" "$ROOT" --buildtype=release >"$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
fi
echo "== build"; ninja -C "$B" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "== CI suites (unit, e2e; host backend)"
meson test -C "$B" --no-rebuild --suite unit --suite e2e >"$OUT/tests_ci.log" 2>&1; grep -E "^(Ok|Fail|Timeout):" "$OUT/tests_ci.log"
echo "== gpu suite (CUDA backend)"
meson test -C "$B" --no-rebuild --suite gpu >"$OUT/tests_gpu.log" 2>&1; GPU_RC=$?
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Timeout):" "$OUT/tests_gpu.log"
cp "$B/meson-logs/testlog.txt" "$OUT/testlog_gpu.txt" 2>/dev/null
[[ $GPU_RC -ne 0 ]] && grep -B2 -A12 "Failure\|FAILED\|error" "$OUT/testlog_gpu.txt" | head -80
[[ $QUICK -eq 1 ]] && exit $GPU_RC

echo "== copies: native vs POS (CUDA backend), GB/s"
"$B/bench/copy_bench_native" >"$OUT/copy_native.txt" 2>&1
POS_BACKEND=cuda "$B/bench/copy_bench_pos" >"$OUT/copy_pos.txt" 2>&1
echo "| direction | host memory | size | native GB/s | POS GB/s | POS / native |"
echo "|---|---|---|---|---|---|"
join -j1 <(grep -v '^#' "$OUT/copy_native.txt" | awk '{print $1"_"$2"_"$3, $4}' | sort) \
         <(grep -v '^#' "$OUT/copy_pos.txt" | awk '{print $1"_"$2"_"$3, $4}' | sort) |
  awk '{split($1,k,"_"); printf "| %s | %s | %s MiB | %.1f | %.1f | %.1f %% |\n", k[1], k[2], k[3], $2, $3, ($2>0)?100*$3/$2:0}' |
  sort -t'|' -k2,2 -k3,3 -k4n | tee "$OUT/copy_table.md"

echo "== kernel launches: native vs POS"
"$B/bench/launch_bench_native" 200000 >"$OUT/launch_native.txt" 2>&1
POS_BACKEND=cuda "$B/bench/launch_bench_pos" 200000 >"$OUT/launch_pos.txt" 2>&1
paste "$OUT/launch_native.txt" "$OUT/launch_pos.txt" | awk 'BEGIN{print "| metric | native | POS |"; print "|---|---|---|"} {printf "| %s | %s | %s |\n", $1, $2, $4}' | tee "$OUT/launch_table.md"

echo "== training step time: native vs POS (in-process, CUDA backend), 5 runs each, alternating"
step() { "$@" 2>&1 >/dev/null | sed -n 's/.*mean step time \([0-9.]*\) ms.*/\1/p'; }
for size in "default:" "large:--input 1024 --hidden 4096 --layers 4 --output 256 --batch 1024 --steps 40"; do
  name="${size%%:*}"; args="${size#*:}"
  for i in 1 2 3 4 5; do
    n=$(step "$B/workloads/mlp_train_native" $args); p=$(POS_BACKEND=cuda step "$B/workloads/mlp_train_pos" $args)
    echo "$name $n $p"
  done
done | tee "$OUT/steps.txt" | awk '{printf "%s: native %s ms, POS %s ms, POS/native %.3f\n", $1, $2, $3, $3/$2}'
exit $GPU_RC
