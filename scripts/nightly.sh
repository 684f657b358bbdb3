#!/usr/bin/env bash
# Nightly regression run: a fixed small suite of the three bench binaries on
# the default backend, run ROUNDS times interleaved into results/<date>/,
# compared with results/baseline/, and an HTML report beside the records;
# results/trend.html draws every night's key figures against the baseline.
# The baseline is the first NIGHTS clean nights (results/baseline/<night>/:
# no bench failed, no run's noise guard said noisy, one night per date),
# pooled: the noise a night is held against is then measured across nights
# (a machine's speed moves more from one night to the next than between
# the rounds of one night). The nights that make the baseline are kept, not
# judged (exit 0). A baseline folder that holds records itself (the layout
# before --baseline-nights) is used as it is, as one night.
#
# Exit: 0 fine; 1 a figure regressed (report compare); 2 a bench or the
# report failed, or nothing could be compared (the other benches still run
# and the report is still written); 3 no regression, but noisy runs (other
# processes took more of the machine than the noise limit) left figures
# unjudged.
#
# Usage: scripts/nightly.sh [--results DIR] [--threshold 0.05] [--rounds 7]
#                           [--baseline-nights 3] [--noise-limit 0.10] [--no-build]
# --noise-limit F: the most of the machine (0.10 = 10%) other processes may
# take in a run that is judged or kept in the baseline; raise it on a
# shared runner (report compare --noise-limit, docs/report.md).
# Paths (--results, PARBENCH_BIN, CARGO_TARGET_DIR) are taken relative to
# the directory it is called from.
# Environment: PARBENCH_BIN (folder of the binaries, default
# ${CARGO_TARGET_DIR:-target}/release), PARBENCH_DATE (the run folder's name,
# default today's UTC date), GITHUB_STEP_SUMMARY (when set, the Markdown
# comparison is appended to it).
set -uo pipefail
caller=$PWD
here=$(cd "$(dirname "$0")/.." && pwd)
# A path as the caller meant it: relative ones from the caller's directory.
from_caller() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$caller/$1" ;; esac; }

results=results
threshold=0.05
noise_limit=0.10
rounds=7
baseline_nights=3
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --results) results=${2:?--results needs a folder}; shift ;;
        --threshold) threshold=${2:?--threshold needs a fraction}; shift ;;
        --rounds) rounds=${2:?--rounds needs a count}; shift ;;
        --no-build) build=0 ;;
        --baseline-nights) baseline_nights=${2:?--baseline-nights needs a count}; shift ;;
        --noise-limit) noise_limit=${2:?--noise-limit needs a fraction}; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "nightly.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "nightly.sh: --rounds must be 1..99, got '$rounds'" >&2; exit 2; }
[[ $baseline_nights =~ ^[1-9][0-9]?$ ]] || { echo "nightly.sh: --baseline-nights must be 1..99, got '$baseline_nights'" >&2; exit 2; }
results=$(from_caller "$results")
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    CARGO_TARGET_DIR=$(from_caller "$CARGO_TARGET_DIR")
    export CARGO_TARGET_DIR
fi
target=${CARGO_TARGET_DIR:-$here/target}
cd "$here" || exit 2

if [ -n "${PARBENCH_BIN:-}" ]; then
    bin=$(from_caller "$PARBENCH_BIN")
else
    bin=$target/release
fi
if [ "$build" = 1 ] && [ -z "${PARBENCH_BIN:-}" ]; then
    cargo build --release --bins || { echo "nightly.sh: build failed" >&2; exit 2; }
fi
for b in bench-collectives bench-layers bench-pipeline report; do
    [ -x "$bin/$b" ] || { echo "nightly.sh: $bin/$b not found (build first, or set PARBENCH_BIN)" >&2; exit 2; }
done

date_name=${PARBENCH_DATE:-$(date -u +%Y-%m-%d)}
out="$results/$date_name"
# A second run the same day gets its own folder: a results folder is never reused.
if [ -e "$out" ]; then
    out="$results/$date_name-$(date -u +%H%M%S)"
fi
baseline="$results/baseline"
mkdir -p "$out"
echo "nightly: results into $out"

failed=0
# The benches' own output (about 250 lines a round) goes to the night's
# log; the terminal gets a line a round and what failed.
log="$out/nightly.log"
# A live line on a terminal, what runs now (erased by the next line); in a
# CI log, nothing.
live() {
    if [ -t 1 ]; then printf '\r\033[2K%s' "$*"; fi
}
run() {
    live "nightly: round $round of $rounds: ${1##*/} (${#states[@]} of 3 done this round, $((SECONDS - started)) s)"
    echo "nightly: $*" >> "$log"
    "$@" >> "$log" 2>&1
    local rc=$?
    live ""
    if [ "$rc" != 0 ]; then
        echo "nightly: FAILED (exit $rc): $* (its output: $log)" >&2
        tail -n 5 "$log" >&2
        failed=1
    fi
    return "$rc"
}

# The fixed suite: small enough for a 2-core runner, large enough to cover
# latency (8 B) and bandwidth (16 MiB) and every schedule's bubble. Each
# round runs every suite once, the rounds interleaved, so that a drift of
# the machine's speed during the night spreads over every suite alike; each
# round is its own run in run.json and the compare takes the rounds' median
# and their spread as the noise.
for ((round = 1; round <= rounds; round++)); do
    started=$SECONDS
    states=()
    run "$bin/bench-collectives" all_reduce all_gather -b 8 -e 16M -f 4 -n 20 -w 5 --out "$out" && states+=(collectives) || states+=(collectives:FAILED)
    run "$bin/bench-layers" --tp 1,2 --mode prefill --hidden 512 --heads 8 --ffn 2048 --seq 64 --microbatch-size 2 --iters 5 --warmup 2 --out "$out" && states+=(layers) || states+=(layers:FAILED)
    run "$bin/bench-pipeline" --stages 4 --schedule gpipe,1f1b,interleaved,zb-h1 --microbatches 1,4,8 --chunks 2 --work sleep:1000 --out "$out" && states+=(pipeline) || states+=(pipeline:FAILED)
    echo "nightly: round $round of $rounds: ${states[*]} ($((SECONDS - started)) s)"
done
echo "nightly: the benches' output is in $log"

# The baseline's nights, oldest first.
nights=()
if ls "$baseline"/*.csv >/dev/null 2>&1; then
    nights=("$baseline")
    echo "nightly: $baseline holds records itself: it is the baseline, as one night"
elif [ -d "$baseline" ]; then
    for d in "$baseline"/*/; do
        [ -d "$d" ] && nights+=("${d%/}")
    done
fi

# Whether the baseline already has a night of this date (a second run the
# same day is told apart: it does not count as another night).
same_day=0
for d in "${nights[@]}"; do
    case "$(basename "$d")" in "$date_name"|"$date_name"-*) same_day=1 ;; esac
done

status=0
if [ "${nights[*]}" != "$baseline" ] && [ ${#nights[@]} -lt "$baseline_nights" ]; then
    if [ "$failed" != 0 ]; then
        echo "nightly: a night with failures is not kept in the baseline" >&2
    elif [ "$same_day" = 1 ]; then
        echo "nightly: the baseline already has a night of $date_name: this second run of the day is not kept as another baseline night (not judged)"
    elif ! "$bin/report" quiet "$out" --noise-limit "$noise_limit"; then
        echo "nightly: noisy: not kept in the baseline (other processes took more than $noise_limit of the machine in a run; the baseline takes clean nights only)" >&2
        status=3
    else
        mkdir -p "$baseline"
        kept="$baseline/$(basename "$out")"
        cp -r "$out" "$kept"
        nights+=("$kept")
        echo "nightly: baseline night ${#nights[@]} of $baseline_nights: $out kept as $kept (not judged; the gate judges each night once the baseline has $baseline_nights)"
    fi
else
    "$bin/report" compare "${nights[@]}" "$out" --threshold "$threshold" --noise-limit "$noise_limit"
    status=$?
    "$bin/report" compare "${nights[@]}" "$out" --threshold "$threshold" --noise-limit "$noise_limit" --markdown > "$out/compare.md"
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
        cat "$out/compare.md" >> "$GITHUB_STEP_SUMMARY"
    fi
    if [ "$status" = 2 ]; then
        failed=1
    fi
fi

# The report shows the baseline's nights beside tonight's run (each folder
# that has records; tonight's own copy in the baseline is not shown twice).
report_dirs=()
for d in "${nights[@]}"; do
    if [ "$(basename "$d")" != "$(basename "$out")" ] && ls "$d"/*.csv >/dev/null 2>&1; then
        report_dirs+=("$d")
    fi
done
if ls "$out"/*.csv >/dev/null 2>&1; then
    report_dirs+=("$out")
fi
if [ ${#report_dirs[@]} -gt 0 ]; then
    "$bin/report" html "${report_dirs[@]}" --output-file "$out/report.html" --title "parbench nightly $date_name" || failed=1
else
    echo "nightly: no records at all: no report" >&2
    failed=1
fi
# Every night so far, figure by figure, against the baseline's band.
"$bin/report" trend "$results" --output-file "$results/trend.html" || failed=1

if [ "$failed" = 1 ]; then
    echo "nightly: a bench or the report failed (see above)" >&2
    exit 2
fi
if [ "$status" = 1 ]; then
    echo "nightly: regression against $baseline (see the table above and $out/report.html)" >&2
    exit 1
fi
if [ "$status" = 3 ]; then
    echo "nightly: noisy: not judged or not kept (other processes took more than 10% of the machine in some runs; see above)" >&2
    exit 3
fi
echo "nightly: no regression; report at $out/report.html"
exit 0
