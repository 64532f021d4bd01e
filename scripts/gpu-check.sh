#!/usr/bin/env bash
# gpu-check.sh: every GPU check and measurement of gptui in one run, on a
# machine with an NVIDIA GPU and the CUDA libraries (driver, NVRTC, cuBLAS,
# NCCL — system-wide or the nvidia-* Python wheels) but no Go toolchain.
# Build the binary elsewhere (go build -o .bin/gptui ./cmd/gptui) and copy
# it beside this repository. Nothing is built here.
#
#   scripts/gpu-check.sh [check|bench|train|all]   (default all)
#
# Writes its logs and a summary table under $OUT (default ./gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.bin/gptui}
OUT=${OUT:-gpu-check-out}
PART=${1:-all}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

say "gpu-check $(date -u +%FT%TZ) part=$PART"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
say "binary: $($BIN help >/dev/null 2>&1 && echo ok) $(stat -c %s "$BIN") bytes"

# peak_mem CMD...: runs CMD while sampling the GPU's used memory; prints
# the peak (MiB) to stdout's last line as "peak_mem_mib N".
peak_mem() {
	local f; f=$(mktemp)
	nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$f" 2>/dev/null &
	local smi=$!
	"$@"
	local rc=$?
	kill $smi 2>/dev/null; wait $smi 2>/dev/null
	echo "peak_mem_mib $(sort -n "$f" | tail -1)"
	rm -f "$f"
	return $rc
}

if [[ $PART == all || $PART == check ]]; then
	# Library discovery must work without LD_LIBRARY_PATH (the wheels'
	# folders are searched); the check says which libraries it loaded.
	timeout 540 "$BIN" gpu check --steps 10 >"$OUT/check.txt" 2>&1
	say "check exit $?"
	sed -n '/== summary ==/,$p' "$OUT/check.txt" | tee -a "$SUMMARY"
fi

if [[ $PART == all || $PART == bench ]]; then
	timeout 300 "$BIN" gpu bench >"$OUT/bench.txt" 2>&1
	say "bench exit $?"
	grep -E '^GEMM|device' "$OUT/bench.txt" | tee -a "$SUMMARY"
fi

if [[ $PART == all || $PART == train ]]; then
	common=(-o Global.device=gpu -o Data.Train.dataset.input_dir= -o Engine.eval_freq=0 -o Engine.save_load.save_steps=0 -o Engine.log_dir="$OUT/log")
	run() { # name timeout args...
		local name=$1 t=$2; shift 2
		peak_mem timeout "$t" "$BIN" train "$@" "${common[@]}" >"$OUT/$name.txt" 2>&1
		say "$name exit $?: $(grep -E '^\[done\]' "$OUT/$name.txt" | head -1) $(tail -1 "$OUT/$name.txt" | grep peak_mem)"
	}
	B124=(-o Global.global_batch_size=16 -o Global.local_batch_size=16 -o Global.micro_batch_size=16)
	run 124m-bf16 300 -c gpt2-124m "${B124[@]}" -o Engine.mix_precision.dtype=bf16 -o Engine.max_steps=30 -o Engine.logging_freq=5
	run 345m-bf16 300 -c 345m-1card -o Engine.mix_precision.dtype=bf16 -o Engine.max_steps=20 -o Engine.logging_freq=5
	run 1.3b-bf16-recompute 400 -c 1.3b-dp8 -o Distributed.dp_degree=1 -o Engine.mix_precision.dtype=bf16 -o Engine.max_steps=12 -o Engine.logging_freq=4
	run 124m-fp16-200 400 -c gpt2-124m "${B124[@]}" -o Engine.mix_precision.dtype=fp16 -o Engine.max_steps=200 -o Engine.logging_freq=20
	grep -E '^\[train\]|^\[amp\]' "$OUT/124m-fp16-200.txt" | awk 'NR%2==1 || /overflow/' | tail -30 | tee -a "$SUMMARY"
fi
say "done"
