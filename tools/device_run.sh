#!/usr/bin/env bash
# device_run.sh — one call on the GPU machine: build there, run the CI suites, the benches, and the
# workload natively. Results go to $OUT (or ./device-out). Used through the `device` tool (docs/BENCHMARKS.md).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/device-out}"
mkdir -p "$OUT"
B=/tmp/pos-build
export PATH="/usr/local/cuda/bin:$PATH"
{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cores: $(nproc)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
  g++ --version | head -1
} | tee "$OUT/machine.txt"
meson setup "$B" --buildtype=release >"$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
ninja -C "$B" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
meson test -C "$B" --no-rebuild --suite unit --suite e2e >"$OUT/tests.log" 2>&1
tail -8 "$OUT/tests.log"
"$B/bench/pipeline_bench" "$@" | tee "$OUT/pipeline_bench.txt"
if [[ -x "$B/workloads/mlp_train_native" ]] && nvidia-smi >/dev/null 2>&1; then
  "$B/workloads/mlp_train_native" >"$OUT/mlp_native.txt" 2>"$OUT/mlp_native.err"; echo "native rc=$?"
  "$B/workloads/mlp_train_pos" >"$OUT/mlp_pos_host.txt" 2>/dev/null; echo "pos(host) rc=$?"
  "$B/workloads/mlp_reference" >"$OUT/mlp_reference.txt" 2>/dev/null
  cmp -s "$OUT/mlp_pos_host.txt" "$OUT/mlp_reference.txt" && echo "pos(host backend) == reference: identical"
  diff <(tail -1 "$OUT/mlp_native.txt") <(tail -1 "$OUT/mlp_reference.txt") >/dev/null && echo "native checksum == reference" \
    || echo "native GPU checksum differs from the CPU reference (cuBLAS summation order): $(tail -1 "$OUT/mlp_native.txt")"
fi
