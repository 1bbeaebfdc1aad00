# shellcheck shell=bash
# Part of the node's check (node_check.sh) on a GPU size: count the ACTIVE InfiniBand ports
# until there are __IB_PORTS__; with --wait (the start task) poll up to __IB_WAIT_SECONDS__ s,
# then fail in one line naming each port that is not ACTIVE and its state. Only ports whose link
# layer is InfiniBand count: the accelerated-networking NIC (mlx5_an0) shows up in
# /sys/class/infiniband too, with an ACTIVE Ethernet port. Any state but ACTIVE is waited on
# (DOWN too: Azure does not say a port is never DOWN while its VF comes up), and the glob is
# read afresh each time, so a device that appears late counts. `sleep` is the node's; the
# tests' stub advances a fake clock.
# shellcheck disable=SC2170  # __IB_PORTS__ is a number once filled

limit=0
[ "${1:-}" != --wait ] || limit=__IB_WAIT_SECONDS__
waited=0
while :; do
  ib=0 idle=""
  for port in /sys/class/infiniband/*/ports/*; do
    [ "$(cat "$port/link_layer" 2>/dev/null)" = InfiniBand ] || continue
    state=$(cat "$port/state" 2>/dev/null || echo unreadable)
    case "$state" in
      *ACTIVE*) ib=$((ib + 1)) ;;
      *) idle="$idle, ${port#/sys/class/infiniband/} is $state" ;;
    esac
  done
  [ "$ib" -lt __IB_PORTS__ ] && [ "$waited" -lt "$limit" ] || break
  sleep __IB_POLL_SECONDS__
  waited=$((waited + __IB_POLL_SECONDS__))
done
[ "$ib" -ge __IB_PORTS__ ] || fail "expected __IB_PORTS__ active InfiniBand ports, found $ib" \
  "after waiting $waited s${idle:+:}${idle#,}"
[ "$waited" -eq 0 ] || echo "InfiniBand ports active after $waited s"
