#!/usr/bin/env bash
# The README's walk-through, run as a new user would run it: every command
# of the fenced sh blocks under the README's "A first session", and of the
# pages it sends a new user to next: docs/usage.md's "Backends" and
# docs/report.md's "Planning a cluster", read from those pages themselves
# (so commands and pages cannot drift apart), one after the other in one
# scratch folder (their results/ and report.html land there). Fails naming
# the first command that fails. Described in docs/ci.md.
#
#   scripts/readme-walkthrough.sh [--bin DIR] [--full] [--keep]
#
#   --bin DIR  the built binaries: `cargo run --release --bin X -- ARGS`
#              runs DIR/X ARGS (default: target/release when the README's
#              first step built it, else target/debug, which
#              `cargo test` builds)
#   --full     every command exactly as written (a few minutes of
#              measurement, plus the release build)
#   --keep     keep the scratch folder (its path is printed)
#
# Quick by default (CI: about 3 minutes on 2 cores with the debug
# binaries): the release build is not run (the binaries are there), and
# the benches are shortened by flags appended to each command, shown in
# its line: bench-collectives -e 1M -n 5 -w 1 (a flag given twice: the
# last wins, as in nccl-tests), bench-layers and bench-pipeline -n 1 -w 0
# where the command does not give them, and bench-layers --seq 32 (the
# CPU's default is 128 tokens). Collectives, ranks, backends, schedules,
# presets and the report commands stay as written. Not run, and named:
# commands that need a launcher or a build this machine lacks (torchrun,
# mpirun, --backend nccl or mpi). A command that prints the notice of a
# spelling of the last release fails too: the pages show today's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD

bin="" full=0 keep=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin=${2:?--bin DIR}; shift 2 ;;
        --full) full=1; shift ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "readme-walkthrough: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
target=${CARGO_TARGET_DIR:-$root/target}
if [ -z "$bin" ]; then
    if [ -x "$target/release/report" ]; then bin=$target/release; else bin=$target/debug; fi
fi
case "$bin" in /*) ;; *) bin=$root/$bin ;; esac

# Where the walk-through's commands are: FILE:SECTION (a heading's text,
# at any level), in the order they run.
sources=(
    "README.md:A first session"
    "docs/usage.md:Backends"
    "docs/report.md:Planning a cluster"
)

# One section's sh blocks, one command a line: continuation lines joined,
# comments dropped. Headings inside a fenced block (output's `# ` lines)
# are text, not headings.
commands() { # FILE SECTION
    awk -v want="$2" '
        /^```/ {
            if (fence) { fence = 0; inside = 0; next }
            fence = 1
            if ($0 ~ /^```sh/ && section == want) inside = 1
            next
        }
        !fence && /^#+ / { section = $0; sub(/^#+ /, "", section); next }
        inside { print }
    ' "$1" | sed -e 's/^#.*$//' -e 's/[[:space:]]#.*$//' -e 's/[[:space:]]*$//' |
        awk '/\\$/ { sub(/\\$/, ""); line = line $0; next } { print line $0; line = "" }' |
        grep -v '^$'
}

# Flags that shorten a bench's timed loops, appended in quick mode (only
# those the command does not give: bench-layers and bench-pipeline refuse
# a flag given twice).
quick_flags() { # BINARY ARGS...
    local name=$1; shift
    local args=" $* "
    case "$name" in
        # The last of a repeated flag wins here, as in nccl-tests.
        bench-collectives) echo "-e 1M -n 5 -w 1" ;;
        bench-layers|bench-pipeline)
            local add=()
            case "$args" in *" -n "*|*" --iters "*) ;; *) add+=(-n 1) ;; esac
            case "$args" in *" -w "*|*" --warmup "*) ;; *) add+=(-w 0) ;; esac
            # bench-layers' block at 32 tokens, not the CPU's default 128.
            if [ "$name" = bench-layers ]; then
                case "$args" in *" --seq "*) ;; *) add+=(--seq 32) ;; esac
            fi
            echo "${add[*]:-}" ;;
    esac
}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/parbench-walkthrough.XXXXXX")
if [ "$keep" = 1 ]; then
    echo "readme-walkthrough: working in $scratch (kept)"
else
    trap 'rm -rf "$scratch"' EXIT
fi
lines=()
for source in "${sources[@]}"; do
    file=${source%%:*} section=${source#*:}
    mapfile -t found < <(commands "$file" "$section")
    if [ "${#found[@]}" -eq 0 ]; then
        echo "readme-walkthrough: no commands under \"$section\" in $file (has a heading moved?)" >&2
        exit 2
    fi
    lines+=("${found[@]}")
done

ran=0 skipped=0 started=$SECONDS
for line in "${lines[@]}"; do
    read -r -a words <<< "$line"
    why=""
    case "$line" in
        torchrun*|mpirun*|srun*)
            command -v "${words[0]}" >/dev/null 2>&1 || why="needs ${words[0]}" ;;
    esac
    case " $line " in *" --backend nccl "*|*" --backend mpi "*) why="needs a --features cuda or mpi build and its GPUs or launcher" ;; esac
    run=()
    if [ -z "$why" ]; then
        if [ "${words[0]} ${words[1]:-} ${words[2]:-}" = "cargo run --release" ] && [ "${words[3]:-}" = "--bin" ]; then
            name=${words[4]}
            args=("${words[@]:5}")
            [ "${args[0]:-}" = "--" ] && args=("${args[@]:1}")
            if [ "$full" = 0 ]; then
                read -r -a extra <<< "$(quick_flags "$name" "${args[@]}")"
                args+=("${extra[@]}")
            fi
            run=("$bin/$name" "${args[@]}")
        elif [ "${words[0]} ${words[1]:-}" = "cargo build" ]; then
            if [ "$full" = 1 ]; then run=(cargo build --manifest-path "$root/Cargo.toml" "${words[@]:2}"); else why="the binaries are built already ($bin)"; fi
        elif [ "${words[0]}" = torchrun ] || [ "${words[0]}" = mpirun ]; then
            run=("${words[@]//target\/release/$bin}")
        else
            why="not a command this script knows how to run"
        fi
    fi
    if [ -n "$why" ]; then
        echo "readme-walkthrough: not run ($why): $line"
        skipped=$((skipped + 1))
        continue
    fi
    echo "readme-walkthrough: \$ ${run[*]}"
    t=$SECONDS
    (cd "$scratch" && "${run[@]}") > "$scratch/last.log" 2>&1
    rc=$?
    if [ "$rc" != 0 ]; then
        echo "readme-walkthrough: FAILED (exit $rc) after $((SECONDS - t)) s: $line" >&2
        tail -n 20 "$scratch/last.log" >&2
        exit 1
    fi
    # The pages show today's spellings: an old one's notice fails it.
    if grep -q "is accepted until the next release" "$scratch/last.log"; then
        echo "readme-walkthrough: FAILED: the pages show a spelling of the last release: $line" >&2
        grep "is accepted until the next release" "$scratch/last.log" >&2
        exit 1
    fi
    echo "readme-walkthrough:   ok in $((SECONDS - t)) s ($(wc -l < "$scratch/last.log") lines of output)"
    ran=$((ran + 1))
done
echo "readme-walkthrough: $ran commands ran, $skipped not run (named above), in $((SECONDS - started)) s"
