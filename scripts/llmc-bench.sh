#!/usr/bin/env bash
# llmc-bench.sh: builds llm.c's CUDA trainer, train_gpt2cu, and times it at
# the shape of gpu-check.sh's train-124m stage: GPT-2 124M from random
# init (-e d12), B=16, T=1024, bf16, no recompute (-r 0, as gptui), 30
# steps, on the same tokens (gptui's documentation, as llm.c shards).
#
#   scripts/llmc-bench.sh [--dry]   build (limit 170 s), then run (60 s):
#                                   two stages, under 4 minutes, rows in
#                                   $OUT/summary.tsv and summary.md
#   scripts/llmc-bench.sh --build   the build alone (gpu-check.sh starts it
#                                   in the background)
#   scripts/llmc-bench.sh --run     the timed run alone (gpu-check.sh's
#                                   llmc stage)
#   scripts/llmc-bench.sh --figures LOG   a run's key figures
#
# Reads llm.c's source from $LLMC (default .bin/llm.c) and the tokens from
# $LLMC_DATA (default .bin/data/llmc), both put there by
# scripts/gpu-prepare.sh: llm.c's code is never committed here. Needs
# nvcc (PATH or /usr/local/cuda/bin), cuBLAS and cuBLASLt (the toolkit's,
# or the nvidia-* wheels'), make; no MPI, NCCL or cuDNN. In dry mode
# (--dry, GPU_CHECK_DRY=1) nvcc and train_gpt2cu are stand-ins that print
# what the real ones print.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LLMC=${LLMC:-.bin/llm.c}
LLMC_DATA=${LLMC_DATA:-.bin/data/llmc}
LLMC_STEPS=${LLMC_STEPS:-30}
DRY=${GPU_CHECK_DRY:-0}

# find_nvcc: nvcc's path, or nothing.
find_nvcc() {
	local n
	for n in "$(command -v nvcc)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
		[[ -n $n && -x $n ]] && { echo "$n"; return; }
	done
}

# lib_dirs: folders that may hold cuBLAS, cuBLASLt and NVML, in order: the
# toolkit of nvcc (CUDA_ROOT), the driver's, the nvidia-* wheels' of the
# Pythons here.
lib_dirs() {
	local py site
	printf '%s\n' "$CUDA_ROOT/lib64" "$CUDA_ROOT"/targets/*/lib /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64
	for py in $(type -ap python3 python); do
		timeout 5 "$py" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null | while IFS= read -r site; do
			printf '%s\n' "$site"/nvidia/cu13/lib "$site"/nvidia/cublas/lib
		done
	done
	printf '%s\n' "$CUDA_ROOT/lib64/stubs" "$CUDA_ROOT"/targets/*/lib/stubs
}

# find_lib NAME: the first libNAME.so or libNAME.so.N in lib_dirs.
find_lib() {
	local d f
	while IFS= read -r d; do
		for f in "$d/lib$1.so" "$d"/lib"$1".so.[0-9]*; do
			[[ -f $f ]] && { echo "$f"; return 0; }
		done
	done < <(lib_dirs)
	return 1
}

llmc_build() {
	if [[ $DRY == 1 ]]; then
		echo "dry: make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 PRECISION=BF16 GPU_COMPUTE_CAPABILITY=90 (stand-in)"
		echo "dry: nvcc --threads=0 -t=0 --use_fast_math -std=c++17 -O3 ... train_gpt2.cu -lcublas -lcublasLt -lnvidia-ml -o train_gpt2cu"
		echo "llmc-bench: built: nvcc=13.0 sm=90 llmc=dry"
		return 0
	fi
	if [[ ! -f $LLMC/train_gpt2.cu ]]; then
		echo "llmc-bench: no llm.c source in $LLMC: run scripts/gpu-prepare.sh where the llm.c mirror is, and carry .bin"
		return 2
	fi
	local nvcc cap
	nvcc=$(find_nvcc)
	if [[ -z $nvcc ]]; then
		echo "llmc-bench: nvcc not found (PATH, /usr/local/cuda*/bin): the CUDA toolkit's compiler is needed to build llm.c"
		return 2
	fi
	CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
	cap=$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.[:space:]')
	if [[ -z $cap ]]; then
		echo "llmc-bench: nvidia-smi gave no compute capability: no GPU here?"
		return 2
	fi
	# Link through unversioned names in a folder of our own, so that the
	# wheels' libcublas.so.13 (no libcublas.so) or the toolkit's NVML stub
	# link; at run time the folders of the real files go on LD_LIBRARY_PATH.
	local link="$LLMC/.link" lib f ld=() libs=()
	rm -rf "$link" && mkdir -p "$link"
	for lib in cublas cublasLt nvidia-ml; do
		if f=$(find_lib $lib); then
			ln -sf "$(readlink -f "$f")" "$link/lib$lib.so"
			[[ $f == */stubs/* ]] || ld+=("$(dirname "$f")")
			libs+=("-l$lib")
			echo "llmc-bench: lib$lib: $f"
		elif [[ $lib != nvidia-ml ]]; then
			echo "llmc-bench: lib$lib.so not found (looked in $(lib_dirs | paste -sd' ')): install the CUDA toolkit or the nvidia-cublas wheel"
			return 2
		fi
	done
	for f in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [[ -d $f ]] && ld+=("$f"); done
	printf '%s\n' "${ld[@]}" | awk '!s[$0]++' | paste -sd: >"$link/ld_library_path"
	# The headers: the toolkit's, else the wheels'.
	local inc=
	if [[ ! -f $CUDA_ROOT/include/cublasLt.h ]]; then
		while IFS= read -r f; do
			f=${f%/lib}/include
			[[ -f $f/cublasLt.h ]] && { inc="-I$f"; break; }
		done < <(lib_dirs)
	fi
	local v
	v=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
	echo "llmc-bench: nvcc $nvcc (release $v), sm_$cap, llm.c $(cat "$LLMC/COMMIT" 2>/dev/null)${inc:+, headers $inc}"
	# llm.c calls cudaMemAdvise with a device number (cudaCpuDeviceId), the
	# CUDA 12 signature; CUDA 13 takes a cudaMemLocation, and nvcc 13.0
	# refuses the call ("no suitable constructor exists to convert from
	# int to cudaMemLocation", seen on an H200, 2026-11-28). The one call,
	# in the host-memory fallback of cudaMallocConditionallyManaged, is
	# rewritten to CUDA 13's form in the copy built here.
	if ((${v%%.*} >= 13)); then
		sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' "$LLMC/llmc/cuda_utils.cuh"
	fi
	(cd "$LLMC" && make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 PRECISION=BF16 \
		GPU_COMPUTE_CAPABILITY="$cap" NVCC="$nvcc" NVCC_LDFLAGS="-L$(readlink -f .link) ${libs[*]}" NVCC_INCLUDES="$inc" CC="${CC:-gcc}") || return
	echo "llmc-bench: built: nvcc=$v sm=$cap llmc=$(cut -c 1-12 "$LLMC/COMMIT" 2>/dev/null)"
}

llmc_run() {
	local data
	data=$(readlink -f "$LLMC_DATA" 2>/dev/null)
	data=${data:-$LLMC_DATA}
	local args=(-i "$data/*.bin" -j "$data/*.bin" -e d12 -b 16 -t 1024 -x "$LLMC_STEPS" -r 0 -v 100000 -m 1 -s 0 -h 0)
	if [[ $DRY == 1 ]]; then
		dry_train_gpt2cu "${args[@]}"
		return
	fi
	if [[ ! -x $LLMC/train_gpt2cu ]]; then
		echo "llmc-bench: $LLMC/train_gpt2cu is not built: scripts/llmc-bench.sh --build"
		return 2
	fi
	if ! ls "$data"/*.bin >/dev/null 2>&1; then
		echo "llmc-bench: no token shards in $LLMC_DATA: run scripts/gpu-prepare.sh and carry .bin"
		return 2
	fi
	echo "llmc-bench: train_gpt2cu ${args[*]}"
	(cd "$LLMC" && LD_LIBRARY_PATH="$(cat .link/ld_library_path 2>/dev/null):${LD_LIBRARY_PATH:-}" ./train_gpt2cu "${args[@]}")
}

# dry_train_gpt2cu: the stand-in for train_gpt2cu: its lines, in its formats.
dry_train_gpt2cu() {
	echo "| device                | DRY H100 80GB HBM3                                 |"
	echo "| peak TFlops           | 989.4                                              |"
	echo "| micro batch size B    | 16                                                 |"
	echo "| sequence length T     | 1024                                               |"
	local s
	for ((s = 1; s <= LLMC_STEPS; s++)); do
		printf 'step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n' \
			"$s" "$LLMC_STEPS" "$((110 - s)).0e-1" 0 1.5 0 3e-4 "$((40 + (s == 1) * 900)).00" 42.0 409600
	done
	echo "total average iteration time: 40.000000 ms"
}

# llmc_figures LOG: tokens/s from the median step time of steps 2 on (the
# first is warm-up, as llm.c's own average has it), llm.c's average,
# its MFU (against its datasheet peak), first and last loss.
llmc_figures() {
	awk '
		/^step +[0-9]+\/[0-9]+ \| loss/ { n++; split($0, f, "|")
			for (i in f) { if (f[i] ~ / ms *$/) { ms = f[i]; sub(/ ms */, "", ms); gsub(/ /, "", ms) }
				if (f[i] ~ /bf16 MFU/) { m = f[i]; sub(/% bf16 MFU */, "", m); gsub(/ /, "", m) } }
			split(f[2], lf, " "); if (first == "") first = lf[2]; last = lf[2]
			if (n > 1) t[++k] = ms; mfu = m }
		/^total average iteration time:/ { avg = $5 }
		/^\| micro batch size B/ { split($0, g, "|"); b = g[3] + 0 }
		/^\| sequence length T/ { split($0, g, "|"); tt = g[3] + 0 }
		END {
			if (k == 0) { printf "no step lines"; exit }
			for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (t[j] + 0 < t[i] + 0) { x = t[i]; t[i] = t[j]; t[j] = x }
			med = (k % 2) ? t[(k + 1) / 2] : (t[k / 2] + t[k / 2 + 1]) / 2
			if (b == 0) b = 16; if (tt == 0) tt = 1024
			printf "steps=%d step_ms=%.2f tokens_per_s=%.0f avg_step_ms=%s llmc_mfu=%s%% first_loss=%s final_loss=%s", n, med, b * tt / med * 1000, avg, mfu, first, last
		}' "$1"
}

case ${1:-} in
--build) llmc_build; exit ;;
--run) llmc_run; exit ;;
--figures) llmc_figures "$2"; exit ;;
--dry) export GPU_CHECK_DRY=1 DRY=1; shift ;;
esac
if (($# > 0)); then
	echo "llmc-bench: unknown argument $1; want --build, --run, --figures LOG or --dry" >&2
	exit 2
fi

# Standalone: two stages under the runner, in 4 minutes.
: "${GPU_CHECK_DEADLINE:=240}"
source scripts/gpu-stages.sh
export LLMC LLMC_DATA LLMC_STEPS
figs_build() { sed -n 's/^llmc-bench: built: //p' "$1"; }
figs_run() { llmc_figures "$1"; }
plan_stage llmc-build 170 "" llmc_build figs_build
plan_stage llmc 60 gpu llmc_run figs_run
check_budget 10
stages_init "llmc-bench $(date -u +%FT%TZ)"
if [[ $DRY != 1 ]] && ! gpu=$(timeout 10 nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1); then
	printf 'preflight\tfail\t0\t10\tno GPU here: %s\n' "$gpu" >>"$OUT/summary.tsv"
	summary_md
	echo "llmc-bench: no GPU here (nvidia-smi: $(tail -n 1 <<<"$gpu" | cut -c 1-200)); run this on the GPU machine, or with --dry" >&2
	rm -rf "$WORK"
	exit 2
fi
SUMMARY_TITLE="llmc-bench $(date -u +%FT%TZ) on ${gpu:-DRY RUN}; llm.c $(cat "$LLMC/COMMIT" 2>/dev/null || echo '?')"
summary_md
echo "$SUMMARY_TITLE"
after() { [[ $1 == llmc-build && $2 != pass ]] && block gpu "the llm.c build $2"; }
AFTER_STAGE=after
# shellcheck disable=SC2119 # every stage
run_plan
stages_done
awk -F'\t' 'NR > 1 && ($2 == "fail" || $2 == "timeout") { bad = 1 } END { exit bad }' "$OUT/summary.tsv"
