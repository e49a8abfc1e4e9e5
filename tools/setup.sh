#!/usr/bin/env bash
# setup.sh: one-shot, idempotent setup of a Debian 12 machine (as root) for building and running POS.
# Installs the apt build deps, CRIU >= 4 via tools/install_criu.sh, then builds into build/ with meson+ninja.
#
# Usage: tools/setup.sh [--no-build]     (see docs/setup.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$ROOT/build"
DO_BUILD=1

log() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --no-build) DO_BUILD=0 ;;
    -h|--help) echo "usage: $0 [--no-build]"; exit 0 ;;
    *) die "unknown argument: $arg (usage: $0 [--no-build])" ;;
  esac
done

PACKAGES=(
  build-essential g++ meson ninja-build pkg-config
  libboost-dev protobuf-compiler libprotobuf-dev libyaml-cpp-dev
  googletest libgtest-dev libgmock-dev
  # for install_criu.sh: verifying trixie's Release file, and an https mirror if the host uses one
  debian-archive-keyring ca-certificates
)

# dpkg-query instead of apt so a re-run on a ready machine costs milliseconds, not an apt-get update.
log "checking packages..."
missing=()
for p in "${PACKAGES[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" == installed ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  [[ $EUID -eq 0 ]] || die "need root to install: ${missing[*]}"
  log "installing packages: ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "all ${#PACKAGES[@]} packages already installed"
fi

log "providing CRIU >= 4..."
bash "$ROOT/tools/install_criu.sh"

# CUDA can't come from apt; the build only compiles the CUDA parts when nvcc is found.
NVCC=""
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  NVCC=/usr/local/cuda/bin/nvcc
  # meson looks for nvcc on PATH, so make the default install location visible to the build below.
  case ":$PATH:" in *":/usr/local/cuda/bin:"*) ;; *) export PATH="/usr/local/cuda/bin:$PATH" ;; esac
elif command -v nvcc >/dev/null 2>&1; then
  NVCC="$(command -v nvcc)"
fi
if [[ -n "$NVCC" ]]; then
  log "nvcc found: $NVCC (CUDA $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
else
  log "nvcc not found (neither /usr/local/cuda/bin/nvcc nor on PATH): CUDA parts will not be built"
fi

if ((DO_BUILD == 0)); then
  log "--no-build: done"
  exit 0
fi
[[ -f "$ROOT/meson.build" ]] || die "no meson.build in $ROOT; nothing to build (use --no-build to install only)"
cd "$ROOT"
if [[ -f "$BUILD_DIR/meson-private/coredata.dat" ]]; then
  log "build/ already configured (rm -rf build to reconfigure, e.g. after installing CUDA)"
else
  log "configuring build/ (release)..."
  meson setup "$BUILD_DIR" --buildtype=release
fi
log "building..."
ninja -C "$BUILD_DIR"
log "done: build output in $BUILD_DIR"
