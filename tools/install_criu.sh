#!/usr/bin/env bash
# install_criu.sh: provides CRIU >= 4, which POS uses to checkpoint/restore the CPU side of processes.
# Run by tools/setup.sh; it records the chosen criu in criu.path, which tools/criu reads. (No POS code
# runs CRIU yet: `pos-cli dump` / `restore` will, through tools/criu; docs/setup.md.)
#
# Debian 12's criu 3.17 dies in `criu check` on current kernels ("Unexpected rt vDSO area bounds"),
# so unless the system already has a working criu >= 4 we unpack trixie's criu and its whole runtime
# closure (including trixie's glibc) into a private prefix and run it through that prefix's own loader.
# The system's apt sources, lists and installed packages are never touched.
#
# Env: POS_CRIU_PREFIX (default /opt/pos/criu), POS_CRIU_MIRROR (default: the host's bookworm mirror),
#      POS_CRIU_SUITE (default trixie). Flag: --force reinstalls the prefix even if it looks complete.
set -euo pipefail

MIN_MAJOR=4
SUITE="${POS_CRIU_SUITE:-trixie}"
PREFIX="$(realpath -m "${POS_CRIU_PREFIX:-/opt/pos/criu}")"
PATH_FILE="$(dirname "$PREFIX")/criu.path"
WRAPPER="$PREFIX/bin/criu"
MARKER=.pos-criu-prefix   # lets us safely rm -rf a prefix we created, and nothing else
FORCE=0

log()  { echo "[criu] $*"; }
warn() { echo "[criu] WARNING: $*" >&2; }
die()  { echo "[criu] error: $*" >&2; exit 1; }

for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown argument: $arg" ;;
  esac
done

# The wrapper bakes the prefix into a shell script; refuse anything that would need quoting.
[[ "$PREFIX" =~ ^/[A-Za-z0-9._/+-]+$ && "$PREFIX" != / ]] || die "unsupported POS_CRIU_PREFIX: $PREFIX"

# Prints the major version of a criu command, or nothing if it cannot run.
criu_major() { { "$1" --version 2>/dev/null || true; } | sed -n 's/^Version: *\([0-9][0-9]*\).*/\1/p' | head -n1; }
criu_version_ok() { local m; m="$(criu_major "$1")"; [[ -n "$m" && "$m" -ge "$MIN_MAJOR" ]]; }

record() {
  mkdir -p "$(dirname "$PATH_FILE")"
  printf '%s\n' "$1" > "$PATH_FILE.tmp" && mv -f "$PATH_FILE.tmp" "$PATH_FILE"
  log "using criu: $1 (recorded in $PATH_FILE)"
}

# 1. A system criu is preferred when it is new enough and actually works on this kernel.
if [[ $FORCE -eq 0 ]]; then
  sys="$(PATH="$PATH:/usr/sbin:/sbin" command -v criu 2>/dev/null || true)"
  if [[ -n "$sys" && "$sys" != "$WRAPPER" ]]; then
    if ! criu_version_ok "$sys"; then
      log "ignoring system $sys ($("$sys" --version 2>/dev/null | head -n1 || echo 'does not run')): need >= $MIN_MAJOR"
    elif ! "$sys" check >/dev/null 2>&1; then
      log "ignoring system $sys: 'criu check' fails"
    else
      record "$sys"; exit 0
    fi
  fi

  # 2. Already installed: nothing to do (keeps re-runs of setup.sh fast).
  if [[ -f "$PREFIX/.complete" ]] && criu_version_ok "$WRAPPER"; then
    log "private criu already installed in $PREFIX ($("$WRAPPER" --version | head -n1))"
    record "$WRAPPER"; exit 0
  fi
fi

# 3. Build the private prefix from trixie.
# Only ever replace a prefix we created ourselves (marker file) or an empty directory.
if [[ -e "$PREFIX" && ! -f "$PREFIX/$MARKER" ]] && ! [[ -d "$PREFIX" && -z "$(ls -A "$PREFIX")" ]]; then
  die "$PREFIX exists and was not created by this script; remove it or set POS_CRIU_PREFIX"
fi
command -v apt-get >/dev/null && command -v dpkg >/dev/null || die "apt-get and dpkg are required"

# Same mirror the host uses for bookworm, so we reach only what the machine is already allowed to.
find_bookworm_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r "$f" ]] || continue
    awk '$1 == "deb" {
           i = 2
           if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
           if ($(i+1) == "bookworm" && $i ~ /^(https?|ftp):\/\//) { print $i; exit }
         }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r "$f" ]] || continue
    awk 'function flush() {
           if (!done && types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && enabled != "no") {
             n = split(uris, u, " "); for (k = 1; k <= n; k++) if (u[k] ~ /^(https?|ftp):\/\//) { print u[k]; done = 1; exit }
           }
           types = suites = uris = enabled = ""
         }
         /^[ \t]*$/ { flush(); next }
         /^[ \t]*#/ { next }
         tolower($1) == "types:"   { $1 = ""; types = $0 }
         tolower($1) == "uris:"    { $1 = ""; uris = $0 }
         tolower($1) == "suites:"  { $1 = ""; suites = $0 }
         tolower($1) == "enabled:" { enabled = tolower($2) }
         END { flush() }' "$f"
  done
}
MIRROR="${POS_CRIU_MIRROR:-$(find_bookworm_mirror | head -n1)}"
MIRROR="${MIRROR%/}"
[[ -n "$MIRROR" ]] || die "no bookworm mirror found in /etc/apt/sources.list{,.d}; set POS_CRIU_MIRROR"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r "$KEYRING" ]] || die "$KEYRING missing: apt-get install debian-archive-keyring"
log "building private criu from $SUITE ($MIRROR) into $PREFIX"

WORK="$(mktemp -d /tmp/pos-criu.XXXXXX)"
STAGE=""
cleanup() { rm -rf "$WORK"; [[ -z "$STAGE" ]] || rm -rf "$STAGE"; }
trap cleanup EXIT

mkdir -p "$WORK"/{lists/partial,cache/archives/partial,sources.list.d,preferences.d,debs}
: > "$WORK/status"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$WORK/sources.list"
# Every piece of apt state is redirected into $WORK; an empty dpkg status keeps the host's installed
# bookworm packages out of dependency resolution, so we get trixie's full closure (libc6 included).
APT_OPTS=(
  -o Dir::Etc::SourceList="$WORK/sources.list"
  -o Dir::Etc::SourceParts="$WORK/sources.list.d"
  -o Dir::Etc::Preferences="$WORK/preferences"
  -o Dir::Etc::PreferencesParts="$WORK/preferences.d"
  -o Dir::State::Lists="$WORK/lists"
  -o Dir::State::status="$WORK/status"
  -o Dir::Cache="$WORK/cache"
  -o APT::Architecture=amd64
  -o APT::Architectures::=amd64
  -o APT::Default-Release="$SUITE"
  -o Acquire::Languages=none
  -o APT::Sandbox::User=root
  -q
)

log "fetching $SUITE package lists..."
apt-get "${APT_OPTS[@]}" update >"$WORK/update.log" 2>&1 || { cat "$WORK/update.log" >&2; die "apt-get update for $SUITE failed"; }

# Top-level lines of `depends --recurse` are real packages; <name> lines are virtual ones.
mapfile -t PKGS < <(apt-cache "${APT_OPTS[@]}" depends --recurse --no-recommends --no-suggests \
                      --no-conflicts --no-breaks --no-replaces --no-enhances criu \
                    | grep -E '^[a-z0-9][a-z0-9.+-]*(:[a-z0-9]+)?$' | sed 's/:.*//' | sort -u)
printf '%s\n' "${PKGS[@]}" | grep -qx criu  || die "criu not found in $SUITE"
printf '%s\n' "${PKGS[@]}" | grep -qx libc6 || die "dependency closure lacks libc6; refusing a half prefix"
log "downloading ${#PKGS[@]} packages: ${PKGS[*]}"
(cd "$WORK/debs" && apt-get "${APT_OPTS[@]}" download "${PKGS[@]}" >"$WORK/download.log" 2>&1) \
  || { cat "$WORK/download.log" >&2; die "apt-get download failed"; }

mkdir -p "$(dirname "$PREFIX")"
STAGE="$(mktemp -d "$(dirname "$PREFIX")/.criu-stage.XXXXXX")"
for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$STAGE"; done
ls "$WORK"/debs/*.deb | xargs -n1 basename > "$STAGE/.packages"
touch "$STAGE/$MARKER"
[[ -x "$STAGE/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" && -x "$STAGE/usr/sbin/criu" ]] \
  || die "unpacked prefix lacks the loader or criu binary"

# Swap in the new prefix (ours_or_absent was checked before downloading).
rm -rf "$PREFIX"
mv "$STAGE" "$PREFIX"
STAGE=""
chmod 755 "$PREFIX"

LIBPATH="$PREFIX/usr/lib/x86_64-linux-gnu"
[[ -d "$PREFIX/lib/x86_64-linux-gnu" ]] && LIBPATH="$LIBPATH:$PREFIX/lib/x86_64-linux-gnu"
mkdir -p "$PREFIX/bin"
cat > "$WRAPPER" <<WRAP
#!/bin/sh
# criu from Debian $SUITE, unpacked by POS tools/install_criu.sh.
# Runs via the prefix's own loader: trixie's libraries need a newer glibc than the host has.
# --library-path (not LD_LIBRARY_PATH) so programs criu spawns keep using the host's libraries.
exec "$PREFIX/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --library-path "$LIBPATH" "$PREFIX/usr/sbin/criu" "\$@"
WRAP
chmod 755 "$WRAPPER"

# 4. Verify. Failing to run at all is fatal; a failing `criu check` is common in unprivileged
# containers (no CAP_SYS_ADMIN, seccomp, ...) and only means dump/restore won't work *here*.
criu_version_ok "$WRAPPER" || { "$WRAPPER" --version >&2 || true; die "installed criu does not run (or reports a version < $MIN_MAJOR)"; }
touch "$PREFIX/.complete"
log "$("$WRAPPER" --version | tr '\n' ' ')"
if out="$("$WRAPPER" check 2>&1)"; then
  log "criu check: $(echo "$out" | grep -v '^Warn' | tail -n1)"
else
  warn "'criu check' failed; expected inside an unprivileged container, dump/restore will not work here:"
  echo "$out" | tail -n5 | sed 's/^/[criu]   /' >&2
fi
log "prefix size: $(du -sh "$PREFIX" | cut -f1)"
record "$WRAPPER"
