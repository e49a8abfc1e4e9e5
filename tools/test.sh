#!/usr/bin/env bash
# test.sh — the README's test command: installs what is missing, builds with warnings as errors,
# runs the unit and e2e suites (host backend), then the lock-free code under ASan+UBSan and TSan.
# Ends with the totals alone on a line: "N passed, N failed".
#
# Usage: tools/test.sh [--quick]   (--quick: skip the sanitizer builds)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    -h|--help) echo "usage: $0 [--quick]"; exit 0 ;;
    *) echo "test: unknown argument $a" >&2; exit 2 ;;
  esac
done
log() { echo "[test] $*"; }
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"

bash "$ROOT/tools/setup.sh" --no-build || { echo "0 passed, 1 failed"; exit 1; }

PASSED=0
FAILED=0
# Counts GoogleTest cases from a meson test log; a test binary that failed without reporting a
# failed case (crash, timeout) counts as one failure.
count() {
  local log="$1"
  read -r p f < <(python3 - "$log" <<'PY'
import json, re, sys
passed = failed = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = t.get("stdout", "") or ""
    ok = len(re.findall(r"^\[       OK \] ", out, re.M))
    bad = len(re.findall(r"^\[  FAILED  \] .* \(\d+ ms\)$", out, re.M))
    if t.get("result") not in ("OK", "EXPECTEDFAIL") and bad == 0:
        bad = 1
    passed += ok
    failed += bad
print(passed, failed)
PY
)
  PASSED=$((PASSED + p))
  FAILED=$((FAILED + f))
}

# build DIR [meson args...]: configure once, then build. A build failure counts as a failure.
build() {
  local dir="$1"; shift
  if [[ ! -f "$dir/build.ninja" ]]; then
    meson setup "$dir" --werror "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
  fi
  ninja -C "$dir" "${TARGETS[@]}" || return 1
}

cd "$ROOT"
TARGETS=()
log "building (warnings are errors)..."
# -O2 without debug info: a third less compile time than debugoptimized; asserts stay on.
if build "$ROOT/build-test" -Doptimization=2 -Ddebug=false; then
  log "running the unit and e2e suites..."
  meson test -C "$ROOT/build-test" --no-rebuild --suite unit --suite e2e --print-errorlogs
  count "$ROOT/build-test/meson-logs/testlog.json"
else
  FAILED=$((FAILED + 1))
fi

if ((QUICK == 0)); then
  # The queues, the gates, the pipeline, the isolation checks, the checkpoint engine (drainer, shadows, lazy
  # loaders, restore and device moves across two devices) and posd's sessions under sanitizers
  # (meson test setups).
  SAN_TESTS=(queue_test gate_test pipeline_test isolation_test checkpoint_test checkpoint_multi_gpu_test remoting_test)
  # remoting_test's posd starts session processes: posd-session and the test kernels' library.
  TARGETS=("${SAN_TESTS[@]/#/unittest/}" remoting/server/posd-session libpos_test_kernels.so)
  for san in asan tsan; do
    if [[ $san == asan ]]; then opt=(-Db_sanitize=address,undefined); else opt=(-Db_sanitize=thread); fi
    log "building the lock-free code with $san..."
    # -g1: line tables for the reports, less compile time than -g.
    if build "$ROOT/build-$san" --buildtype=debug -Dcpp_args=-g1 "${opt[@]}" -Db_lundef=false -Dwith_cuda=disabled; then
      meson test -C "$ROOT/build-$san" --no-rebuild --setup "$san" --print-errorlogs "${SAN_TESTS[@]}"
      count "$ROOT/build-$san/meson-logs/testlog-$san.json"
    else
      FAILED=$((FAILED + 1))
    fi
  done
fi

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
