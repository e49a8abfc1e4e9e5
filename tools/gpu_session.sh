#!/usr/bin/env bash
# gpu_session.sh — one `device` call's work on the GPU machine: the carried CRIU installed, a release
# build in build-gpu, then tests and commands in turn; its results are what docs/BENCHMARKS.md records.
#
#   bash tools/gpu_session.sh --prepare          here, before the first call: fills .deps (git ignores
#                                                it) with tools/install_criu.sh's CRIU, CLI11's headers
#                                                and iproute2's ip (network-namespace tests)
#   bash tools/gpu_session.sh [t NAME[@FILTER]...] [sh 'COMMAND'...]
#                                                there (`device` run, carry [".deps"]): builds, then
#                                                runs each test (meson test NAME, FILTER a gtest
#                                                filter) and each command, in the order given
# A failing test prints its log's failures and leaves the whole log under $OUT/fail/NAME.txt. The
# machine's GPU, driver, cores and the build time come first. (Sections of docs/BENCHMARKS.md before
# 2026-11-29 name this script by its earlier, untracked path, .carry/gpu16.sh.)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
export PATH="/usr/local/cuda/bin:$PATH"

if [[ "${1:-}" == "--prepare" ]]; then
  criu_path_file=/opt/pos/criu.path
  [[ -r $criu_path_file ]] || { echo "gpu_session: no CRIU installed here (run tools/setup.sh first)" >&2; exit 1; }
  prefix="$(dirname "$(dirname "$(head -n 1 "$criu_path_file")")")"
  [[ -d $prefix && -d /usr/include/CLI ]] || { echo "gpu_session: $prefix or /usr/include/CLI is missing" >&2; exit 1; }
  rm -rf .deps/criu .deps/include/CLI && mkdir -p .deps/include &&
    cp -a "$prefix" .deps/criu && cp -a /usr/include/CLI .deps/include/CLI || exit 1
  # iproute2 (the GPU machine has none): `ip` for the tests that stand another host up as a network
  # namespace (bench/netns_common.sh), with the libraries it needs beyond libc and zlib, given to it
  # alone through the loader (`ip netns exec`'s programs keep the machine's own).
  ipbin="$(command -v ip || true)"
  if [[ -n $ipbin ]]; then
    rm -rf .deps/iproute2 && mkdir -p .deps/iproute2/bin .deps/iproute2/lib && cp "$ipbin" .deps/iproute2/bin/ip.real &&
      ldd "$ipbin" | awk '$3 ~ /^\// {print $3}' | grep -vE '/lib(c|z)\.so' | xargs -r cp -L -t .deps/iproute2/lib &&
      printf '#!/bin/sh\nd=$(dirname "$(readlink -f "$0")")\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$d/../lib" "$d/ip.real" "$@"\n' \
        >.deps/iproute2/bin/ip && chmod 755 .deps/iproute2/bin/ip || exit 1
  else
    echo "gpu_session: no ip here (apt-get install iproute2): tests with network namespaces will fail there" >&2
  fi
  echo "gpu_session: .deps ready ($(du -sh .deps | cut -f1)); carry [\".deps\"] in each device call"
  exit 0
fi

# The CRIU of .deps at the prefix it was built for (its wrapper has the prefix baked in).
if [[ -d .deps/criu ]]; then
  mkdir -p /opt/pos && rm -rf /opt/pos/criu && cp -a .deps/criu /opt/pos/criu &&
    echo /opt/pos/criu/bin/criu >/opt/pos/criu.path || echo "gpu_session: cannot install the carried CRIU" >&2
else
  echo "gpu_session: no .deps/criu carried: CRIU's tests will fail (run --prepare here, carry .deps)" >&2
fi
command -v ip >/dev/null || { [[ -x .deps/iproute2/bin/ip ]] && export PATH="$PATH:$ROOT/.deps/iproute2/bin"; }
echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); cores $(nproc); $(date -u +%FT%TZ)"
t0=$(date +%s)
if [[ ! -f build-gpu/build.ninja ]]; then
  meson setup build-gpu --buildtype=release >/tmp/gpu-session-setup.log 2>&1 || { tail -30 /tmp/gpu-session-setup.log; exit 1; }
fi
ninja -C build-gpu >/tmp/gpu-session-build.log 2>&1 || { grep -E "error|FAILED" /tmp/gpu-session-build.log | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

mode="" rc=0
for a in "$@"; do
  case "$a" in t|sh) mode="$a"; continue ;; esac
  if [[ $mode == t ]]; then
    name="${a%%@*}" filter=()
    [[ "$a" == *@* ]] && filter=("--test-args=--gtest_filter=${a#*@}")
    meson test -C build-gpu --no-rebuild "$name" "${filter[@]}" >/tmp/gpu-session-test.log 2>&1 || {
      rc=1
      grep -B3 -A25 "Failure\|FAILED\|rror" build-gpu/meson-logs/testlog.txt | tail -80
      mkdir -p "${OUT:-/tmp}/fail" && cp build-gpu/meson-logs/testlog.txt "${OUT:-/tmp}/fail/$name.txt"
    }
    grep -E "^ *[0-9]+/[0-9]+ " /tmp/gpu-session-test.log | tail -3
  elif [[ $mode == sh ]]; then
    echo "== sh: $a"
    bash -c "$a"; echo "== rc=$?"
  else
    echo "gpu_session: '$a' comes before any 't' or 'sh'" >&2; exit 2
  fi
done
exit $rc
