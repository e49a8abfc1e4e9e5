#!/usr/bin/env bash
# setup.sh: one-shot, idempotent setup of a Debian 12 machine (as root) for building and running POS.
# Installs the apt build deps, CRIU >= 4 via tools/install_criu.sh, then builds into build/ with meson+ninja.
#
# The CUDA toolkit cannot come from Debian's archive: it is checked first, and a build without it stops
# and says what to install (the main job, workloads/mlp_train_pos, is compiled by nvcc), unless
# --without-cuda asks for the rest alone (posd, pos-cli, the libraries and tests on the host backend).
#
# Usage: tools/setup.sh [--no-build] [--without-cuda]     (see docs/setup.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$ROOT/build"
DO_BUILD=1
WITHOUT_CUDA=0

log() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --no-build) DO_BUILD=0 ;;
    --without-cuda) WITHOUT_CUDA=1 ;;
    -h|--help) echo "usage: $0 [--no-build] [--without-cuda]"; exit 0 ;;
    *) die "unknown argument: $arg (usage: $0 [--no-build] [--without-cuda])" ;;
  esac
done

# CUDA can't come from apt. Checked before anything is installed, so a machine without it learns at
# once what is missing rather than after minutes of apt and a build that silently leaves the main job out.
NVCC=""
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  NVCC=/usr/local/cuda/bin/nvcc
  # meson looks for nvcc on PATH, so make the default install location visible to the build below.
  case ":$PATH:" in *":/usr/local/cuda/bin:"*) ;; *) export PATH="/usr/local/cuda/bin:$PATH" ;; esac
elif command -v nvcc >/dev/null 2>&1; then
  NVCC="$(command -v nvcc)"
fi
if [[ -n "$NVCC" ]]; then
  log "CUDA toolkit: $NVCC (CUDA $("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
elif ((DO_BUILD == 1 && WITHOUT_CUDA == 0)); then
  # A fresh Debian 12 machine: the toolkit's compiler, runtime and cuBLAS headers and the driver
  # stub from NVIDIA's Debian 12 repository (no GPU or driver needed to build; the host backend runs).
  log "CUDA toolkit: not found; installing it from NVIDIA's Debian 12 repository..."
  CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
  CUDA_PKGS=(cuda-nvcc-13-0 cuda-cudart-dev-13-0 libcublas-dev-13-0 cuda-driver-dev-13-0)
  keyring="$(mktemp --suffix=.deb)"
  if [[ $EUID -eq 0 ]] &&
     { command -v curl >/dev/null || { apt-get update -q && apt-get install -y -q curl; }; } &&
     curl -fsSL --max-time 60 -o "$keyring" "$CUDA_REPO/cuda-keyring_1.1-1_all.deb" &&
     dpkg -i "$keyring" && apt-get update -q &&
     DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${CUDA_PKGS[@]}" &&
     [[ -x /usr/local/cuda/bin/nvcc ]]; then
    NVCC=/usr/local/cuda/bin/nvcc
    export PATH="/usr/local/cuda/bin:$PATH"
    log "CUDA toolkit: installed ($NVCC)"
  else
    rm -f "$keyring"
    cat >&2 <<MSG
[setup] error: the CUDA toolkit is not installed (no /usr/local/cuda/bin/nvcc, no nvcc on PATH), and it
[setup]   could not be installed from NVIDIA's repository ($CUDA_REPO; needs root and the network).
[setup]   The main job (build/workloads/mlp_train_pos) and the client libraries are compiled by nvcc
[setup]   against the toolkit's headers; no GPU is needed to build them, and without one they run on
[setup]   POS's host backend. Install the toolkit (12.x or 13.x), e.g. as root:
[setup]     curl -fsSLO $CUDA_REPO/cuda-keyring_1.1-1_all.deb && dpkg -i cuda-keyring_1.1-1_all.deb
[setup]     apt-get update && apt-get install -y ${CUDA_PKGS[*]}
[setup]   then run this script again. To build everything else without it (posd, pos-cli, the tests on
[setup]   the host backend): tools/setup.sh --without-cuda
MSG
    exit 1
  fi
  rm -f "$keyring"
else
  log "CUDA toolkit: not found; the CUDA parts (main job, client libraries, CUDA backend) will not be built"
fi

PACKAGES=(
  build-essential g++ meson ninja-build pkg-config
  libboost-dev protobuf-compiler libprotobuf-dev libyaml-cpp-dev libcli11-dev
  googletest libgtest-dev libgmock-dev
  # for install_criu.sh: verifying trixie's Release file, and an https mirror if the host uses one
  debian-archive-keyring ca-certificates
  # the migration tests: a network namespace and a veth pair (ip, tc), entering namespaces (nsenter)
  iproute2 util-linux
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

if ((DO_BUILD == 0)); then
  log "--no-build: done"
  exit 0
fi
[[ -f "$ROOT/meson.build" ]] || die "no meson.build in $ROOT; nothing to build (use --no-build to install only)"
cd "$ROOT"
if [[ -f "$BUILD_DIR/meson-private/coredata.dat" && -n "$NVCC" ]] && ! grep -q mlp_train_pos "$BUILD_DIR/build.ninja" 2>/dev/null; then
  # Configured before the toolkit was installed: meson would keep building without the CUDA parts.
  log "build/ was configured without the CUDA toolkit; reconfiguring..."
  meson setup --wipe "$BUILD_DIR" --buildtype=release
elif [[ -f "$BUILD_DIR/meson-private/coredata.dat" ]]; then
  log "build/ already configured"
else
  log "configuring build/ (release)..."
  meson setup "$BUILD_DIR" --buildtype=release
fi
log "building..."
ninja -C "$BUILD_DIR"
if [[ -n "$NVCC" ]]; then
  [[ -x "$BUILD_DIR/workloads/mlp_train_pos" ]] || die "the build did not produce the main job (build/workloads/mlp_train_pos)"
  log "done: the main job is build/workloads/mlp_train_pos (README, first command)"
else
  log "done: build output in $BUILD_DIR (without the CUDA parts)"
fi
