#!/usr/bin/env bash
# Emulated cluster network on one machine: N network namespaces (pbhost0..),
# each with one veth into a bridge that lives in its own namespace (pbswitch),
# every link shaped with tc tbf in both directions. Every byte between ranks
# crosses a shaped link; the root namespace is never touched.
#
#   scripts/netns.sh up N --rate RATE [--host-rate I=RATE]... [--burst BYTES]
#   scripts/netns.sh down
#   scripts/netns.sh run N --rate RATE [--host-rate I=RATE]... [--burst BYTES] -- COMMAND ARGS...
#
# RATE is tc's syntax (1gbit, 200mbit); --host-rate I=RATE shapes host I's
# link to RATE instead (one slow host, e.g. --host-rate 2=250mbit). `run` brings the hosts up, starts
# COMMAND as rank i of a tcp job inside pbhost<i> (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT, PARBENCH_JOB_TOKEN set; PARBENCH_WIRE is the
# caller's, or tcp-RATE when unset; PARBENCH_BIND is the caller's, or rank
# i's own CPU slot i when there is a CPU per rank), waits for every rank,
# tears everything down (also on failure or interrupt) and exits with the
# first failing rank's status, or 0. Needs root (or CAP_NET_ADMIN) and iproute2.
#
# Addresses come from 198.18.0.0/15, the range RFC 2544 sets aside for
# network benchmark tests: host i is 198.18.0.(i+1).
set -euo pipefail

# PARBENCH_NETNS_PREFIX (default pb) names the namespaces <prefix>host<i> and
# <prefix>switch, so that a test can run beside a manual run without either
# tearing down the other's.
NS_PREFIX=${PARBENCH_NETNS_PREFIX:-pb}
HOST_RATES=()
RATE=""
[[ $NS_PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "netns.sh: PARBENCH_NETNS_PREFIX must be 1-8 lowercase letters/digits" >&2; exit 2; }
PREFIX=${NS_PREFIX}host
SWITCH=${NS_PREFIX}switch
SUBNET=198.18.0
PORT=${MASTER_PORT:-29517}

die() { echo "netns.sh: $*" >&2; exit 2; }

usage() {
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

need_tools() {
    command -v ip >/dev/null || die "ip (iproute2) not found"
    command -v tc >/dev/null || die "tc (iproute2) not found"
}

# Bytes per second of a tc rate (1gbit, 200mbit, 500kbit, 1000000bit, 10mbps).
rate_bytes() {
    local r=${1,,} num unit
    num=${r%%[a-z]*}
    unit=${r#"$num"}
    [[ $num =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "bad rate '$1' (expected e.g. 1gbit or 200mbit)"
    case $unit in
        bit) awk -v n="$num" 'BEGIN{printf "%d", n/8}' ;;
        kbit) awk -v n="$num" 'BEGIN{printf "%d", n*1000/8}' ;;
        mbit) awk -v n="$num" 'BEGIN{printf "%d", n*1000000/8}' ;;
        gbit) awk -v n="$num" 'BEGIN{printf "%d", n*1000000000/8}' ;;
        bps) awk -v n="$num" 'BEGIN{printf "%d", n}' ;;
        kbps) awk -v n="$num" 'BEGIN{printf "%d", n*1000}' ;;
        mbps) awk -v n="$num" 'BEGIN{printf "%d", n*1000000}' ;;
        gbps) awk -v n="$num" 'BEGIN{printf "%d", n*1000000000}' ;;
        *) die "bad rate unit in '$1' (bit, kbit, mbit, gbit, bps, kbps, mbps, gbps)" ;;
    esac
}

down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^(${PREFIX}[0-9]+|${SWITCH})$" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}

shape() { # ns dev rate burst
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$3" burst "$4" latency 100ms
}

# The rate of host i: its --host-rate, or the common --rate.
host_rate() { # i
    local spec
    for spec in "${HOST_RATES[@]}"; do
        if [ "${spec%%=*}" = "$1" ]; then
            echo "${spec#*=}"
            return
        fi
    done
    echo "$RATE"
}

# Burst of a rate: 4 ms of traffic, at least 32 KiB: small enough that a
# 16 MiB transfer is paced by the rate, large enough for tbf at the
# kernel's timer resolution.
burst_of() { # rate
    local bps burst
    bps=$(rate_bytes "$1")
    burst=$((bps / 250))
    ((burst < 32768)) && burst=32768
    echo "$burst"
}

up() {
    local n=$1 rate=$2 burst=$3 i
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 250)); then die "N must be 1..250, got '$n'"; fi
    [ -n "$rate" ] || die "--rate is required (e.g. --rate 1gbit)"
    rate_bytes "$rate" >/dev/null
    local spec
    for spec in "${HOST_RATES[@]}"; do
        [[ $spec =~ ^[0-9]+=[0-9a-zA-Z.]+$ ]] || die "bad --host-rate '$spec' (expected I=RATE, e.g. 2=250mbit)"
        ((${spec%%=*} < n)) || die "--host-rate ${spec%%=*}: there are only $n hosts (0..$((n - 1)))"
        rate_bytes "${spec#*=}" >/dev/null
    done
    down
    ip netns add "$SWITCH"
    ip -n "$SWITCH" link add br0 type bridge
    ip -n "$SWITCH" link set br0 up
    ip -n "$SWITCH" link set lo up
    for ((i = 0; i < n; i++)); do
        local ns=$PREFIX$i
        ip netns add "$ns"
        ip -n "$SWITCH" link add "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$SWITCH" link set "p$i" master br0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        # Both directions of the host's link: what it sends and what it receives.
        local r b
        r=$(host_rate "$i")
        b=${burst:-$(burst_of "$r")}
        shape "$ns" eth0 "$r" "$b"
        shape "$SWITCH" "p$i" "$r" "$b"
        [ "$r" = "$rate" ] || echo "netns.sh: host $i's link shaped to $r (the others $rate)"
    done
    echo "netns.sh: $n hosts ${PREFIX}0..${PREFIX}$((n - 1)) at $SUBNET.1..$SUBNET.$n, links $rate (burst ${burst:-$(burst_of "$rate")} B)"
}

run() {
    local n=$1 rate=$2 burst=$3
    shift 3
    [ $# -gt 0 ] || die "run needs -- COMMAND ARGS..."
    trap 'down' EXIT
    trap 'exit 130' INT TERM
    up "$n" "$rate" "$burst"
    local token pids=() i status=0 rc
    token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    # The wire's name in the records: the caller's PARBENCH_WIRE, or tcp-RATE.
    # One name for two rates lets report compare hold one against the other.
    local wire=${PARBENCH_WIRE:-tcp-$rate}
    # The emulated hosts share this machine's CPUs: one each when there are
    # enough (LOCAL_RANK is 0 on every host, so binding cannot follow it).
    local cpus bind
    cpus=$(nproc)
    for ((i = 0; i < n; i++)); do
        if [ -n "${PARBENCH_BIND:-}" ]; then
            bind=$PARBENCH_BIND
        elif ((n <= cpus)); then
            bind=$i
        else
            bind=off
        fi
        ip netns exec "$PREFIX$i" env RANK="$i" WORLD_SIZE="$n" LOCAL_RANK=0 \
            MASTER_ADDR="$SUBNET.1" MASTER_PORT="$PORT" PARBENCH_JOB_TOKEN="$token" \
            PARBENCH_WIRE="$wire" PARBENCH_BIND="$bind" "$@" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then rc=0; else rc=$?; fi
        if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
            status=$rc
            echo "netns.sh: rank $i exited with status $rc" >&2
        fi
    done
    return $status
}

main() {
    [ $# -ge 1 ] || usage
    local cmd=$1
    shift
    case $cmd in
        down) need_tools; down ;;
        up | run)
            need_tools
            [ $# -ge 1 ] || usage
            local n=$1 rate="" burst=""
            HOST_RATES=()
            shift
            while [ $# -gt 0 ]; do
                case $1 in
                    --rate) rate=${2:-}; shift 2 || die "--rate needs a value" ;;
                    --burst) burst=${2:-}; shift 2 || die "--burst needs a value" ;;
                    --host-rate) HOST_RATES+=("${2:-}"); shift 2 || die "--host-rate needs I=RATE" ;;
                    --) shift; break ;;
                    *) die "unknown argument '$1'" ;;
                esac
            done
            RATE=$rate
            if [ "$cmd" = up ]; then up "$n" "$rate" "$burst"; else run "$n" "$rate" "$burst" "$@"; fi
            ;;
        -h | --help) usage ;;
        *) die "unknown command '$cmd' (up, down, run)" ;;
    esac
}

main "$@"
