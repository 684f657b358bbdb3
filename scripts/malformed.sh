#!/usr/bin/env bash
# Runs the malformed invocations of issue 15 (and more) against the built
# binaries and counts panics (exit 101 or "panicked" on stderr), aborts
# (134, SIGABRT/SIGSEGV), hangs (past the per-call limit) and errors that
# are not one line. Each call gets a fresh scratch folder and LIMIT seconds.
#   scripts/malformed.sh [BIN_DIR]   (default target/debug)
# Exit 0 when none panicked, aborted or hung; prints one line per failure
# and the counts.
set -u
BIN=$(realpath "${1:-target/debug}")
LIMIT=${LIMIT:-40}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
C="$BIN/bench-collectives"; L="$BIN/bench-layers"; P="$BIN/bench-pipeline"; R="$BIN/report"
total=0; bad=0; multiline=0
try() { # try WANT_CODE CMD...   WANT_CODE: 2, or "any" (not a panic/abort/hang)
  local want=$1; shift
  total=$((total + 1))
  local out="$TMP/$total"; mkdir -p "$out"
  ( cd "$out" && timeout -k 5 "$LIMIT" "$@" >stdout 2>stderr ); local rc=$?
  local err; err=$(cat "$out/stderr")
  local why=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ] && [ "$want" != 137 ]; then why="hang (rc $rc)"
  elif [ $rc -eq 101 ] || grep -q panicked <<<"$err"; then why="panic"
  elif [ $rc -eq 134 ] || [ $rc -eq 139 ] || [ $rc -eq 136 ]; then why="abort (rc $rc)"
  elif [ "$want" != any ] && [ $rc -ne "$want" ]; then why="exit $rc, wanted $want"
  fi
  if [ "$want" = 2 ] && [ -z "$why" ] && [ "$(grep -c . <<<"$err")" -ne 1 ]; then
    multiline=$((multiline + 1)); why="not one line"
  fi
  if [ -n "$why" ]; then
    bad=$((bad + 1)); echo "FAIL [$why] ${*#"$BIN"/}" | cut -c1-200; head -c 300 "$out/stderr"; echo
  fi
}
printf 'a,b\n' >"$TMP/tiny.csv"
head -c 10000000 /dev/urandom | tr -d '\n' >"$TMP/garbage.csv"
mkdir -p "$TMP/garbage"; cp "$TMP/garbage.csv" "$TMP/garbage/collectives.csv"
printf '18446744073709551615F0\n' >"$TMP/s1.csv"
printf '4000000000F0,4000000000B0\n' >"$TMP/s2.csv"
printf '0F18446744073709551615\n' >"$TMP/s3.csv"
printf 'F0,B0\n' >"$TMP/s4.csv"
printf '\xff\xfe\n' >"$TMP/s5.csv"
LONG=$(printf 'x%.0s' $(seq 5000))
# The rules every binary shares (CMD...): an --out it cannot write (under
# /proc, a file, a name past the limit) is refused, one that is not UTF-8
# is used; a --timeout below zero is refused, and 0 is nccl-tests' "no
# timeout" (the longest, a day) in every binary.
every_binarys_rules() {
  try 2 "$@" --out /proc/x
  try 2 "$@" --out "$TMP/tiny.csv"
  try 2 "$@" --out "/tmp/$LONG"
  try 0 "$@" --out "$TMP/$(printf '\xff\xfe')"
  try 0 "$@" --timeout 0
  try 2 "$@" --timeout -5
}
CS=(--backend local -np 2 -n 2 -w 0 -e 64)
# bench-collectives
try 2 "$C" -b 64G -e 64G --backend local -np 2
try 2 "$C" --backend local -np 100000 -e 1M
try 2 "$C" --backend tcp -np 100000 -e 1M
every_binarys_rules "$C" "${CS[@]}"
try 2 "$C" "${CS[@]}" -n 0
try 2 "$C" "${CS[@]}" -n -1
try 2 "$C" "${CS[@]}" -np 0
# nccl-tests' rule for bench-collectives: the last of a repeated flag wins.
try 0 "$C" "${CS[@]}" -e 1M -e 256K
try 0 "$C" "${CS[@]}" --backend tcp
try 2 "$C" "${CS[@]}" -b 1K -e 8
# nccl-tests' -f 1 (and 0): step by -i bytes.
try 0 "$C" "${CS[@]}" -f 1
try 0 "$C" "${CS[@]}" -f 0
try 2 "$C" "${CS[@]}" -r -2
try 2 "$C" "${CS[@]}" -C 1
# nccl-tests' types and ops, every one of them, run and check here.
try 0 "$C" "${CS[@]}" -d int8,uint32,uint64,f8e4m3,f8e5m2 -o mulsum
try 2 "$C" "${CS[@]}" -d float8
try 2 "$C" "${CS[@]}" -o premul
try 2 "$C" "${CS[@]}" -i 0 -b 8 -e 64
try 2 "$C" "${CS[@]}" -b 99999999999999999999999
try 2 "$C" "${CS[@]}" -b 1Q
try 2 "$C" "${CS[@]}" -r 7
try 2 "$C" "${CS[@]}" -a 9
try 2 "$C" "${CS[@]}" --straggler 9:5
try 2 "$C" "${CS[@]}" --straggler x
try 2 "$C" "${CS[@]}" no_such_collective
try 2 "$C" "${CS[@]}" -d nope
try 2 "$C" "${CS[@]}" -o nope
try 2 "$C" "${CS[@]}" --algo nope
try 2 "$C" "${CS[@]}" --inplace-only --outplace-only
try 2 "$C" "${CS[@]}" --graph 4
try any "$C" "${CS[@]}" --fit-from 0
try 2 "$C" "${CS[@]}" --nonsense
# bench-layers
LS=(--backend local --iters 1 --warmup 0)
try 2 "$L" "${LS[@]}" --hidden 100000000 --ffn 400000000
every_binarys_rules "$L" "${LS[@]}"
try 2 "$L" "${LS[@]}" --iters 0
try 2 "$L" "${LS[@]}" --heads 0
try 2 "$L" "${LS[@]}" --hidden 0
try 2 "$L" "${LS[@]}" --hidden -3
try 2 "$L" "${LS[@]}" --hidden 64 --heads 3
try 2 "$L" "${LS[@]}" --tp 3
try 2 "$L" "${LS[@]}" --tp 0
try 2 "$L" "${LS[@]}" --tp 64
try 2 "$L" "${LS[@]}" --iters 2 --iters 3
try 2 "$L" "${LS[@]}" --preset nope
try 2 "$L" "${LS[@]}" --link x
try 2 "$L" "${LS[@]}" --link -1,2
try 2 "$L" "${LS[@]}" --mode decode --mode train
try 2 "$L" "${LS[@]}" --seq 0
try 2 "$L" "${LS[@]}" --microbatch-size 0
try 2 "$L" "${LS[@]}" --microbatch-size 100000000 --seq 100000000
try 2 "$L" --backend tcp -n 100000 --tp 100000
# bench-pipeline
PS=(--backend local --stages 2 --microbatches 4 --iters 1 --warmup 0)
try 2 "$P" "${PS[@]}" --microbatches 10000000
try 2 "$P" --backend local --stages 100000 --microbatches 4 --iters 1
try 2 "$P" "${PS[@]}" --work sleep:999999999999999 --timeout 5
try any "$P" "${PS[@]}" --work sleep:10000 --timeout 5
try 2 "$P" --backend tcp --stages 2 --microbatches 4 --iters 1 --work sleep:999999999999999 --timeout 5
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/s1.csv"
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/s2.csv"
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/s3.csv"
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/s4.csv"
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/s5.csv"
try 2 "$P" "${PS[@]}" --schedule-csv "$TMP/nope.csv"
try 2 "$P" "${PS[@]}" --threads 0
try 2 "$P" "${PS[@]}" --stages 0
try 2 "$P" "${PS[@]}" --microbatches 0
try 2 "$P" "${PS[@]}" --stages -2
try 2 "$P" "${PS[@]}" --stages 2 --stages 3
every_binarys_rules "$P" "${PS[@]}"
try 2 "$P" "${PS[@]}" --work nope
try 2 "$P" "${PS[@]}" --work sleep:-1
try 2 "$P" "${PS[@]}" --schedule nope
try 2 "$P" "${PS[@]}" --chunks 0
try 2 "$P" "${PS[@]}" --hidden 0
try 2 "$P" "${PS[@]}" --hidden 100000000 --microbatch-size 100000000
try 2 "$P" "${PS[@]}" --slow-rank 9:5
try 2 "$P" "${PS[@]}" --stage-layers 1,x
# report
try 2 "$R" html "$TMP/garbage" --out "$TMP/r.html"
try 2 "$R" compare "$TMP/garbage" "$TMP/garbage"
try 2 "$R" plan --heads 4 --kv-heads 3
try 2 "$R" plan --heads 0
try 2 "$R" html "$TMP/nope" --out "$TMP/r.html"
try 2 "$R" compare "$TMP/nope" "$TMP/nope"
try 2 "$R" model --hidden -1
# bad records: NaN figures, non-UTF-8, a timeline outside the folder
FX=$(dirname "$BIN")/../reports/tests/fixtures/shm
[ -d "$FX" ] || FX=$(realpath "$(dirname "$0")/../reports/tests/fixtures/shm")
for v in NaN inf -1; do
  d="$TMP/fig$v"; cp -r "$FX" "$d"
  awk -F, -v OFS=, -v v="$v" 'NR==1{for(i=1;i<=NF;i++) if($i=="p50_us") c=i} NR>1{$c=v} 1' "$FX/collectives.csv" >"$d/collectives.csv"
  try 2 "$R" compare "$FX" "$d"
  try 2 "$R" html "$d" --out "$d/r.html"
done
d="$TMP/utf"; cp -r "$FX" "$d"; printf '\xff\xfe\n' >>"$d/collectives.csv"
try 2 "$R" compare "$d" "$d"
d="$TMP/esc"; cp -r "$FX" "$d"; sed -i 's|timeline-pipeline-[^,]*gpipe-M1.json|../../../../etc/hostname|' "$d/pipeline.csv"
try 2 "$R" html "$d" --out "$d/r.html"
d="$TMP/lock"; mkdir -p "$d"; echo 999999999 >"$d/.parbench.lock"
try 0 "$C" "${CS[@]}" all_reduce --out "$d"
# issue 33: files that are not regular, counts past their limits, bad settings
d="$TMP/fifo"; mkdir -p "$d"; mkfifo "$d/run.json"
try 2 "$C" "${CS[@]}" --out "$d"
d="$TMP/zero"; mkdir -p "$d"; ln -s /dev/zero "$d/run.json"
try 2 "$C" "${CS[@]}" --out "$d"
try 2 "$C" "${CS[@]}" --out /dev/full
try 2 "$C" "${CS[@]}" -J /dev/full
try 2 "$C" "${CS[@]}" -J /sys/kernel/x.json
for n in 99999999999 18446744073709551615; do
  try 2 "$C" "${CS[@]}" -n "$n"
  try 2 "$C" "${CS[@]}" -w "$n"
  try 2 "$C" "${CS[@]}" -N "$n"
  try 2 "$C" "${CS[@]}" links -n "$n"
  try 2 "$L" "${LS[@]}" -n "$n"
  try 2 "$P" "${PS[@]}" --iters "$n"
done
try 2 "$P" "${PS[@]}" --schedule-csv /dev/zero
try 2 env PARBENCH_TCP_SPIN_US=abc "$C" --backend tcp -np 2 -e 64 -n 1
try 2 env PARBENCH_TCP_BUF_BYTES=4096 "$C" --backend tcp -np 2 -e 64 -n 1
try 2 "$R" html "$FX" --output-file /dev/full
d="$TMP/rec"; cp -r "$FX" "$d"
try 2 "$R" html "$d" --output-file "$d/collectives.csv"
# issue 33, item 7: absurd plan shapes and node sizes
try 2 "$R" plan --layers 4294967295 --hidden 4294967295 --heads 1 --ffn 1 --seq 1 --global-batch 1 --gpus 1 --compute-tflops 1 --intra 1,1
try 2 "$R" plan --model tiny --global-batch 8 --gpus 4 --gpus-per-node 100000 --compute-tflops 1 --intra 1,1
try 2 "$R" plan --model tiny --global-batch 8 --gpus 8 --device-file /dev/zero
# issue 52: outputs over other files, links past memory, launch variables
d="$TMP/notes"; mkdir -p "$d"; echo notes >"$d/notes.txt"
try 2 "$R" html "$FX" --output-file "$d/notes.txt"
try 2 "$R" plan --model tiny --global-batch 8 --gpus 8 --compute-tflops 1 --intra 1,1 --output-file "$d/notes.txt"
grep -qx notes "$d/notes.txt" || { bad=$((bad + 1)); echo "FAIL [notes.txt replaced]"; }
try 2 "$C" links --backend local -np 2 -e 1024G
try 2 env PARBENCH_JOB_TOKEN="$(printf 't%.0s' $(seq 2000))" "$C" --backend tcp -np 2 -e 64 -n 1
try 2 env MASTER_ADDR=127.0.0.1:29500 "$C" --backend tcp -np 2 -e 64 -n 1
try 2 env PARBENCH_BIND=99999 "$C" "${CS[@]}"
try 2 "$R" plan --against "$FX"
d="$TMP/dangling"; cp -r "$FX" "$d"; rm "$d/collectives.csv"; ln -s nowhere.csv "$d/collectives.csv"
try 2 "$R" html "$d" --output-file "$TMP/d.html"
d="$TMP/tlfifo"; cp -r "$FX" "$d"; t=$(find "$d" -maxdepth 1 -name "timeline-*.json" | head -1); rm "$t"; mkfifo "$t"
try 2 "$R" html "$d" --output-file "$TMP/t.html"
d="$TMP/nights"; mkdir -p "$d"; cp -r "$FX" "$d/2026-11-29"; mkfifo "$d/2026-11-29/compare.md"
try 2 "$R" trend "$d" --output-file "$TMP/trend.html"
# Two runs in the same second, each pid 1 of its own PID namespace (root
# and unshare only): two run ids, two run.json entries.
if unshare -p -f --mount-proc true 2>/dev/null; then
  d="$TMP/ns"
  unshare -p -f --mount-proc "$C" "${CS[@]}" all_reduce --out "$d" >/dev/null 2>&1 &
  unshare -p -f --mount-proc "$C" "${CS[@]}" all_reduce --out "$d" >/dev/null 2>&1
  wait
  total=$((total + 1))
  n=$(grep -c '"run_id"' "$d/run.json")
  [ "$n" -eq 2 ] || { bad=$((bad + 1)); echo "FAIL [two namespaced runs, $n run.json entries]"; }
fi
echo "malformed invocations: $total; failures: $bad (of them not one line: $multiline)"
[ "$bad" -eq 0 ]
