#!/usr/bin/env bash
# ckpt-mem.sh: each rank's peak resident memory (VmHWM) over a whole local
# job, and the bytes of each file its checkpoints hold: what a save costs
# the ranks (BENCHMARKS.md, "Checkpoints written by every rank").
#
#   scripts/ckpt-mem.sh BIN NPROC [-o Section.key=value ...]
#
# Runs `BIN run --no-tui --nproc NPROC -o ...` in a fresh scratch
# directory, reads /proc/PID/status of every worker (`gptui train -c
# jobs/...`) every 50 ms until it ends, and prints one line per rank
# (its RANK from the worker's environment) with its last VmHWM, then the
# checkpoint files with their sizes.
set -euo pipefail
BIN=$(realspath() { cd "$(dirname "$1")" && echo "$PWD/$(basename "$1")"; }; realspath "$1")
NPROC=$2
shift 2
dir=$(mktemp -d /tmp/ckpt-mem.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
declare -A peak
"$BIN" run --no-tui --nproc "$NPROC" "$@" >run.log 2>&1 &
job=$!
start=$(date +%s.%N)
while kill -0 "$job" 2>/dev/null; do
	for p in $(pgrep -f " train -c jobs/" || true); do
		r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^RANK=//p' || true)
		h=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$p/status" 2>/dev/null || true)
		[ -n "$r" ] && [ -n "$h" ] && peak[$r]=$h
	done
	sleep 0.05
done
wait "$job" && rc=0 || rc=$?
end=$(date +%s.%N)
echo "exit $rc after $(echo "$end - $start" | bc) s; $(grep -c . run.log) log lines"
grep -E "\[checkpoint\] saved|error|killed" run.log | head -5 || true
for r in $(printf '%s\n' "${!peak[@]}" | sort -n); do
	printf 'rank %s peak %.3f GB\n' "$r" "$(echo "${peak[$r]} * 1024 / 10^9" | bc -l)"
done
find output -name '*.safetensors' -printf '%p %s\n' 2>/dev/null | sort || true
