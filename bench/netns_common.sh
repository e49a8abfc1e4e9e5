# bench/netns_common.sh — sourced by migrate_bench.sh --netns and torch_migrate_host.sh: "another
# host" as a network namespace joined by a veth pair, a shared migration secret, and the pos-cli
# a posd there runs to restore a job (in the sourcing script's namespaces, where its files are).

# netns_pair NS HERE THERE IP_A IP_B: the namespace NS, this side's end HERE (IP_A) and its end
# THERE (IP_B), both up; exits the script if it cannot (root and iproute2 are needed).
netns_pair() {
  ip netns add "$1" && ip link add "$2" type veth peer name "$3" && ip link set "$3" netns "$1" &&
    ip addr add "$4/24" dev "$2" && ip -n "$1" addr add "$5/24" dev "$3" && ip link set "$2" up &&
    ip -n "$1" link set "$3" up && ip -n "$1" link set lo up || { echo "cannot make the namespace (root, iproute2)"; exit 1; }
}
# migration_secret_and_cli DIR CLI: DIR/secret (0600, random) and DIR/cli-here, which runs CLI in
# this script's network and mount namespaces.
migration_secret_and_cli() {
  head -c 48 /dev/urandom | base64 >"$1/secret"; chmod 600 "$1/secret"
  printf '#!/bin/sh\nexec nsenter --net=/proc/%d/ns/net --mount=/proc/%d/ns/mnt %s "$@"\n' $$ $$ "$2" >"$1/cli-here"
  chmod 700 "$1/cli-here"
}
# port_of LOG IP: the port a posd logged it accepts migrations on (waits up to 20 s).
port_of() { local p; for _ in $(seq 1 400); do p=$(sed -n "s/.*accepting migrations on $2:\([0-9]*\).*/\1/p" "$1"); [[ -n "$p" ]] && { echo "$p"; return; }; sleep 0.05; done; }
