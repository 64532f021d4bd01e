#!/usr/bin/env bash
# gpu-check.sh: every GPU check and measurement of gptui in one run of at
# most 9 minutes, on a machine with an NVIDIA GPU, its driver and the CUDA
# libraries (system-wide or the nvidia-* Python wheels) but no Go: the
# binary is built beforehand (scripts/gpu-prepare.sh, where Go is) and
# carried in .bin with llm.c's source and the data.
#
#   scripts/gpu-check.sh [--dry] [STAGE...]     (default: every stage)
#
# The stages, in order, each under its own time limit (seconds):
#
#   libs          15  where libcuda, NVRTC, cuBLAS(Lt) and NCCL load from
#                     (gptui gpu libs); when the binary's own search misses
#                     one, the nvidia-* wheels of every Python here are
#                     found and handed over in GPTUI_CUDA_LIBDIR. Without
#                     the driver or the GPU the GPU stages are skipped;
#                     without NCCL, the NCCL stage
#   selftest      45  gptui gpu check --only selftest (watchdog 20 s)
#   kernels-fp32  50  every kernel against the CPU backend, GEMMs in fp32
#                     (the first compile of the kernels by NVRTC is here)
#   kernels-bf16  30  the same with bf16 GEMMs
#   tiny-fp32     35  tiny's losses, 10 steps, GPU fp32 vs CPU (1e-5 rel)
#   124m-bf16     45  124M B=4 T=64: losses (0.05 abs) and gradients in bf16
#   bench         30  gptui gpu bench: the bf16, fp16, fp32 GEMM rates
#   train-124m    75  124M, B=16 T=1024, bf16, 30 steps: tokens/s, MFU
#                     against the GPU's data-sheet bf16 peak (measured
#                     for a GPU kernels/cuda/peak.go does not know)
#   fp16-124m     45  the same in fp16 with loss scaling, 60 steps: the
#                     loss falls, skipped steps counted
#   train-llama   45  a Llama of about 0.8B (llama-tiny's layers at 2048
#                     wide, 16 deep, 16 query heads of 128, 4 key/value
#                     heads; GPT-2's vocabulary), B=8 T=1024, bf16, 20
#                     steps: tokens/s, MFU, the loss falls
#   nccl-1rank    30  gpu check --only nccl: a one-rank job's NCCL
#                     communicators, every operation against the CPU
#   llmc          80  llm.c's train_gpt2cu at train-124m's shape
#                     (scripts/llmc-bench.sh; its build starts in the
#                     background at the beginning, on the CPU); skipped,
#                     saying why, where nvcc or make is missing
#
# With the 15 s of checks before the first stage the limits sum to 540 s;
# a stage gets at most the time left before that deadline. A stage's
# command that outlives its limit gets SIGQUIT (a Go program prints its
# goroutines' stacks), then SIGKILL.
#
# Writes, as each stage ends, $OUT/summary.tsv and $OUT/summary.md (one
# row per stage: status pass/fail/timeout/skipped, seconds, key figures)
# and all output to $OUT/stages.log (OUT defaults to ./gpu-check-out).
# Without a GPU it stops at once with one line (exit 2). --dry (or
# GPU_CHECK_DRY=1) checks this script's own logic on any machine:
# scripts/gpu-stages.sh describes it and the other settings.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
if [[ ${1:-} == --dry ]]; then
	export GPU_CHECK_DRY=1
	shift
fi
source scripts/gpu-stages.sh

BIN=${BIN:-.bin/gptui}
[[ $BIN == */* ]] || BIN=./$BIN
export BIN


LLMC=${LLMC:-.bin/llm.c}
export LLMC

# gptui ARGS: the binary; in dry mode the gpu subcommands are stand-ins
# that print what the real ones print (the other commands run for real,
# on the CPU).
gptui() {
	if [[ $DRY == 1 && ${1:-} == gpu ]]; then
		dry_gpu "${@:2}"
		return
	fi
	"$BIN" "$@"
}

# dry_gpu SUB ARGS: the stand-in for 'gptui gpu SUB': lines in the formats
# of cmd/gptui/gpu.go and packages cudacheck and gpucheck.
dry_gpu() {
	local part=
	[[ ${2:-} == --only ]] && part=$3
	case $1 in
	libs)
		cat <<-'EOF'
			library         file                                                                                 version           why
			libcuda.so      /dry/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04                                  driver CUDA 13.0  1 GPU(s), 0: DRY H100 80GB HBM3 sm_90 79 GiB
			libnvrtc.so     /dry/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13     NVRTC 13.0        built for CUDA 13, which the driver (CUDA 13.0) supports; the newest in the first folder that has one
			libcublas.so    /dry/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13    CUDA 13           built for CUDA 13, which the driver (CUDA 13.0) supports; the newest in the first folder that has one
			libcublasLt.so  /dry/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13  CUDA 13           loaded with /dry/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13, from the same folder
			libnccl.so      /dry/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2       NCCL 2.27.7       the newest in the first folder that has one
		EOF
		;;
	check)
		case $part in
		selftest)
			echo "== device self-test =="
			echo "PASS  open device 0                      DRY H100 80GB HBM3, sm_90, 132 SMs"
			echo "self-test: 31 passed, 0 failed in 2.4s"
			printf '\n== summary ==\n%-4s  %-40s %s\n' PASS "self-test (driver, NVRTC, cuBLAS, NCCL)" ok
			;;
		kernels-fp32 | kernels-bf16)
			echo "== kernels, GEMMs in ${part#kernels-} =="
			echo "cuda: kernels for sm_90 compiled by NVRTC 13.0 in 9.1 s (/dry/cache)"
			echo "PASS LayerNormForward out0                         rel 1.20e-07  max 4.77e-07  (tol 1e-05)"
			echo "kernels: 52 checks, 0 failed"
			printf '\n== summary ==\n%-4s  %-40s %s\n' PASS "kernels ${part#kernels-} vs CPU" ok
			;;
		tiny-fp32)
			echo "== model parity: tiny, fp32, vs the CPU backend =="
			printf '\n== summary ==\n%-4s  %-40s %s\n' PASS "fp32 loss, 10 steps (tol 1e-5 rel)" "worst 3.10e-07; final 9.812345 vs 9.812346"
			;;
		nccl)
			echo "== NCCL fabric, one rank: every operation vs the CPU =="
			printf '\n== summary ==\n'
			printf '%-4s  %-40s %s\n' PASS "NCCL fabric: 4 splits" "0.41 s"
			for c in dp mp pp tied; do printf '%-4s  %-40s %s\n' PASS "NCCL fabric $c: every operation" "ok (0.05 s)"; done
			printf '%-4s  %-40s %s\n' PASS "NCCL fabric record" "52 operations done, 0 in flight"
			;;
		124m-bf16)
			echo "== model parity: gpt2-124m B=4 T=64, bf16, vs fp32 CPU =="
			printf '\n== summary ==\n%-4s  %-40s %s\n%-4s  %-40s %s\n' PASS "bf16 loss, 10 steps (tol 0.05 abs)" "worst 0.0123; final 9.1234 vs 9.1300" \
				PASS "bf16 gradients (thr + |ref|·0.079)" ok
			;;
		esac
		;;
	bench)
		echo "device: DRY H100 80GB HBM3"
		echo "GEMM bf16 8192³: 702.5 TFLOP/s (1.2 s)"
		echo "GEMM fp16 8192³: 710.1 TFLOP/s (1.1 s)"
		echo "GEMM fp32 (IEEE) 4096³: 48.3 TFLOP/s (0.9 s)"
		printf '\n== summary ==\n%-4s  %-40s %s\n' PASS "GEMM bf16 8192³" "702.5 TFLOP/s"
		;;
	esac
}

# ---- stages (each runs in a bash of its own, under its limit) --------------

stage_libs() {
	gptui gpu libs && return 0
	# The binary's own search missed something: look for the nvidia-*
	# wheels of every Python here and hand their folders over.
	local dirs
	dirs=$(python_wheel_dirs)
	if [[ -z $dirs || -n ${GPTUI_CUDA_LIBDIR:-} ]]; then
		return 2
	fi
	echo "gpu-check: retrying with GPTUI_CUDA_LIBDIR=$dirs (the nvidia-* wheels of the Pythons here; the binary's own search missed them: see kernels/cuda/lib.go)"
	GPTUI_CUDA_LIBDIR=$dirs gptui gpu libs
	local rc=$?
	echo "$dirs" >"$WORK/libdir"
	return $rc
}

# python_wheel_dirs: the lib folders of the nvidia-* wheels in the
# site-packages of every python3 on PATH and of /opt/*/.venv, /opt/conda,
# joined by ':'.
python_wheel_dirs() {
	local py site d out=()
	for py in $(type -ap python3 python) /opt/*/.venv/bin/python3 /opt/*/bin/python3; do
		[[ -x $py ]] || continue
		while IFS= read -r site; do
			for d in "$site"/nvidia/*/lib; do
				[[ -d $d ]] && out+=("$d")
			done
		done < <(timeout 3 "$py" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
	done
	local IFS=:
	printf '%s' "$(printf '%s\n' "${out[@]}" | awk '!seen[$0]++' | paste -sd:)"
}

stage_selftest() { gptui gpu check --only selftest --watchdog 20s; }
stage_kernels_fp32() { gptui gpu check --only kernels-fp32 --watchdog 40s; }
stage_kernels_bf16() { gptui gpu check --only kernels-bf16 --watchdog 20s; }
stage_tiny_fp32() { gptui gpu check --only tiny-fp32 --steps 10 --watchdog 30s; }
stage_124m_bf16() { gptui gpu check --only 124m-bf16 --steps 10 --watchdog 60s; }
stage_bench() { gptui gpu bench --watchdog 25s; }

# train [--llama] NAME -o ...: gptui train of GPT-2 124M (--llama:
# llama-tiny, which the stage widens) at B=16 T=1024 on the built-in
# corpus, no dropout (llm.c has none), no eval, no checkpoint, with the
# stage's own -o settings; in dry mode tiny (llama-tiny at its own shape)
# at B=2 T=16, 20 steps (past the lr's warmup, so that the loss falls), on
# the CPU (the later -o wins).
train() {
	local cfg=gpt2-124m dry=()
	if [[ $1 == --llama ]]; then
		cfg=llama-tiny
		shift
	fi
	if [[ $DRY == 1 ]]; then
		[[ $cfg == gpt2-124m ]] && cfg=tiny
		dry=(-o Global.device=cpu -o Global.global_batch_size=2 -o Global.local_batch_size=2 -o Global.micro_batch_size=2
			-o Data.Train.dataset.max_seq_len=16 -o Engine.max_steps=20 -o Engine.logging_freq=1)
		[[ $cfg == llama-tiny ]] && dry+=(-o Model.hidden_size=64 -o Model.num_layers=2 -o Model.num_attention_heads=4
			-o Model.num_key_value_heads=2 -o Model.ffn_hidden_size=176)
	fi
	gptui train -c "$cfg" -o Global.device=gpu \
		-o Global.global_batch_size=16 -o Global.local_batch_size=16 -o Global.micro_batch_size=16 \
		-o Data.Train.dataset.max_seq_len=1024 -o Data.Train.dataset.input_dir= \
		-o Model.hidden_dropout_prob=0 -o Model.attention_probs_dropout_prob=0 \
		-o Engine.eval_freq=0 -o Engine.save_load.save_steps=0 -o Engine.log_dir="$WORK/$1" "${@:2}" "${dry[@]}"
}

stage_train_124m() {
	local dtype=bf16
	[[ $DRY == 1 ]] && dtype=fp32 # bf16 on a CPU needs AVX512_BF16
	train train-124m -o Engine.mix_precision.dtype=$dtype -o Engine.max_steps=30 -o Engine.logging_freq=5 -o Optimizer.lr.decay_steps=30
}

stage_fp16_124m() {
	train fp16-124m -o Engine.mix_precision.dtype=fp16 -o Engine.mix_precision.scale_loss=32768 \
		-o Engine.max_steps=60 -o Engine.logging_freq=5 -o Optimizer.lr.decay_steps=60
}

# stage_train_llama: Llama's layers (RMSNorm, RoPE, SwiGLU, grouped-query
# attention on the head-size-128 flash kernels) through a whole training
# step: about 0.8B parameters, B=8 T=1024, bf16, 20 steps.
stage_train_llama() {
	local dtype=bf16
	[[ $DRY == 1 ]] && dtype=fp32
	train --llama train-llama -o Engine.mix_precision.dtype=$dtype -o Model.max_position_embeddings=1024 \
		-o Model.hidden_size=2048 -o Model.num_layers=16 \
		-o Model.num_attention_heads=16 -o Model.num_key_value_heads=4 -o Model.ffn_hidden_size=5632 \
		-o Global.global_batch_size=8 -o Global.local_batch_size=8 -o Global.micro_batch_size=8 \
		-o Engine.max_steps=20 -o Engine.logging_freq=5 -o Optimizer.lr.decay_steps=20
}

# A job of one process has no data path to run over NCCL; 'gpu check
# --only nccl' runs its communicators: a world of one, split as the
# engine's groups are, every operation on each against the CPU.
stage_nccl_1rank() { gptui gpu check --only nccl --watchdog 20s; }

stage_llmc() {
	# The build was started in the background at the beginning; wait for it
	# (within this stage's limit), then time the run.
	if [[ ! -e $WORK/llmc-build.rc ]]; then
		echo "== waiting for the llm.c build, started in the background at the beginning (its output: llmc-build.log)"
		while [[ ! -e $WORK/llmc-build.rc ]]; do sleep 0.5; done
	fi
	local rc
	rc=$(cat "$WORK/llmc-build.rc")
	echo "== llm.c build: exit $rc in $(cat "$WORK/llmc-build.secs" 2>/dev/null) s (its output: llmc-build.log)"
	if ((rc != 0)); then
		tail -n 5 "$OUT/llmc-build.log"
		echo "the llm.c build failed (exit $rc): $(last_line "$OUT/llmc-build.log")"
		return 1
	fi
	scripts/llmc-bench.sh --run
}

# llmc_tools_missing: the tools llm.c's build needs that this machine
# lacks, of nvcc (where scripts/llmc-bench.sh looks for it: PATH, then
# /usr/local/cuda*/bin) and make, joined by " or "; nothing when both are
# here. In dry mode, those named in GPU_CHECK_DRY_MISSING are missing.
llmc_tools_missing() {
	local tool n found out=
	for tool in nvcc make; do
		found=
		if [[ $DRY == 1 ]]; then
			[[ " ${GPU_CHECK_DRY_MISSING:-} " == *" $tool "* ]] || found=1
		elif [[ $tool == make ]]; then
			command -v make >/dev/null 2>&1 && found=1
		else
			for n in "$(command -v nvcc)" /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
				[[ -n $n && -x $n ]] && found=1 && break
			done
		fi
		[[ -n $found ]] || out+="${out:+ or }$tool"
	done
	printf '%s' "$out"
}

# llmc_build_bg: scripts/llmc-bench.sh --build, niced, under its own
# limit, its output in $OUT/llmc-build.log; its exit status and seconds
# go to $WORK/llmc-build.rc and .secs for the llmc stage. Stopped (TERM),
# it stops the build.
llmc_build_bg() {
	local t0 p rc
	t0=$(now_ms)
	trap 'kill -TERM $p 2>/dev/null; exit 143' TERM
	timeout -k 5 "$(scaled 200)" nice -n 10 scripts/llmc-bench.sh --build >"$OUT/llmc-build.log" 2>&1 &
	p=$!
	wait $p
	rc=$?
	elapsed "$t0" >"$WORK/llmc-build.secs"
	echo "$rc" >"$WORK/llmc-build.rc"
}

# ---- figures: each stage's key figures, from its output --------------------

figs_libs() {
	awk '
		/^libcuda\.so / && /driver CUDA/ { if (match($0, /driver CUDA [0-9.]+/)) d = substr($0, RSTART + 12, RLENGTH - 12)
			if (match($0, /0: .* sm_[0-9]+/)) g = substr($0, RSTART + 3, RLENGTH - 3) }
		/NVRTC [0-9]/ { if (match($0, /NVRTC [0-9.]+/)) v = substr($0, RSTART + 6, RLENGTH - 6) }
		/NCCL [0-9]/ { if (match($0, /NCCL [0-9.]+/)) c = substr($0, RSTART + 5, RLENGTH - 5) }
		/ (NOT FOUND|INCOMPATIBLE): / { m = m " " $1 }
		/^gpu-check: retrying with/ { r = 1 }
		END { gsub(/ /, "_", g)
			if (g != "") o = o " gpu=" g; if (d != "") o = o " driver_cuda=" d; if (v != "") o = o " nvrtc=" v; if (c != "") o = o " nccl=" c
			if (m != "") o = o " missing=" substr(m, 2); if (r) o = o " via=GPTUI_CUDA_LIBDIR"
			printf "%s", substr(o, 2) }' "$1"
}

# figs_check LOG: the rows of 'gpu check''s summary table, "name: result"
# joined by "; ", with the PASS and FAIL counts first.
figs_check() {
	awk '
		/^== summary ==/ { t = 1; next }
		t && /^(PASS|FAIL)  / { if ($1 == "PASS") p++; else f++
			s = substr($0, 7); sub(/  +/, ": ", s); rows = rows (rows == "" ? "" : "; ") s }
		/^self-test: [0-9]+ passed/ || /^kernels: [0-9]+ checks/ { c = $0 }
		END { printf "passed=%d failed=%d", p, f; if (c != "") printf " (%s)", c; if (rows != "") printf " %s", rows }' "$1"
}

figs_bench() {
	awk '/^GEMM / { n = $2; if ($3 == "(IEEE)") { n = n "_ieee" } for (i = 1; i <= NF; i++) if ($(i) == "TFLOP/s") printf "%s%s_tflops=%s", (k++ ? " " : ""), n, $(i - 1) }' "$1"
}

# figs_train LOG: from the [done] line, or the last [train] line of a run
# cut short; the [amp] line's skipped steps; whether the loss fell.
figs_train() {
	awk '
		/\[train\] / { for (i = 1; i <= NF; i++) { if ($i == "loss:") { l = $(i + 1); if (first == "") first = l }
				if ($i == "ips:") ips = $(i + 1); if ($i == "mfu:") mfu = $(i + 1); if ($i == "step:") st = $(i + 1) } }
		/\[amp\] / { for (i = 1; i <= NF; i++) { if ($i == "skipped_steps:") sk = $(i + 1); if ($i == "loss_scale:") sc = $(i + 1) } }
		/\[backend\] .* peak [0-9.]+ GFLOP\/s/ { for (i = 1; i <= NF; i++) if ($i == "peak") pk = $(i + 1) / 1000 }
		/\[done\] steps:/ { for (i = 1; i <= NF; i++) { if ($i == "steps:") ds = $(i + 1); if ($i == "step:") step = $(i + 1)
				if ($i == "ips:") dips = $(i + 1); if ($i == "mfu:") dmfu = $(i + 1); if ($i == "first") df = $(i + 2); if ($i == "final") dl = $(i + 2) } }
		END {
			if (ds != "") printf "steps=%s step_s=%s tokens_per_s=%s mfu=%s first_loss=%s final_loss=%s", ds, step, dips, dmfu, df, dl
			else if (st != "") { printf "partial: last_step=%s tokens_per_s=%s mfu=%s first_loss=%s last_loss=%s", st, ips, mfu, first, l; df = first; dl = l }
			else printf "no [train] line"
			if (sk != "") printf " skipped_steps=%s loss_scale=%s", sk, sc
			if (df != "" && dl != "") printf " loss_fell=%s", (dl + 0 < df + 0 ? "yes" : "no")
			if (pk != "") printf " peak_tflops=%g", pk
		}' "$1"
}


figs_llmc() {
	scripts/llmc-bench.sh --figures "$1"
	local g l
	g=$(figure train-124m tokens_per_s)
	l=$(sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' <(scripts/llmc-bench.sh --figures "$1"))
	if [[ -n $g && -n $l ]]; then
		# The [train] lines' MFU is against the data sheet's peak; against
		# the bench stage's measured bf16 GEMM rate it is mfu·peak/measured,
		# and llm.c's, at the same FLOPs a token, that over the ratio.
		awk -v g="$g" -v l="$l" -v m="$(figure train-124m mfu)" -v pk="$(figure train-124m peak_tflops)" \
			-v meas="$(figure bench bf16_tflops)" 'BEGIN { r = g / l; sub(/%/, "", m)
			printf " gptui_over_llmc=%.2f (goal >= 1)", r
			if (m != "" && pk > 0 && meas > 0 && r > 0) printf " gptui_mfu_vs_measured_peak=%.1f%% llmc_mfu_vs_measured_peak=%.1f%%", m * pk / meas, m * pk / meas / r }'
	fi
}

# ---- the run ----------------------------------------------------------------

plan_stage libs 15 "" stage_libs figs_libs
plan_stage selftest 45 gpu stage_selftest figs_check
plan_stage kernels-fp32 50 gpu stage_kernels_fp32 figs_check
plan_stage kernels-bf16 30 gpu stage_kernels_bf16 figs_check
plan_stage tiny-fp32 35 gpu stage_tiny_fp32 figs_check
plan_stage 124m-bf16 45 gpu stage_124m_bf16 figs_check
plan_stage bench 30 gpu stage_bench figs_bench
plan_stage train-124m 75 gpu stage_train_124m figs_train
plan_stage fp16-124m 45 gpu stage_fp16_124m figs_train
plan_stage train-llama 45 gpu stage_train_llama figs_train
plan_stage nccl-1rank 30 "nccl gpu" stage_nccl_1rank figs_check
plan_stage llmc 80 "gpu llmc" stage_llmc figs_llmc
DRY_FLOOR=([train-124m]=30 [fp16-124m]=30 [train-llama]=30) # dry mode: these train on the CPU for real
PREFLIGHT=15 # seconds before the first stage: the binary, nvidia-smi
check_budget "$PREFLIGHT"

for s in "$@"; do
	if [[ ! " ${STAGE_NAMES[*]} " == *" $s "* ]]; then
		echo "gpu-check: no stage $s; the stages: ${STAGE_NAMES[*]}" >&2
		exit 2
	fi
done
selected() { [[ -z $STAGES || " $STAGES " == *" $1 "* ]]; }
STAGES="$*"

# after_stage NAME STATUS: what a stage's outcome means for the others.
after_stage() {
	[[ $1 == libs ]] || return 0
	if [[ -s $WORK/libdir ]]; then
		GPTUI_CUDA_LIBDIR=$(cat "$WORK/libdir")
		export GPTUI_CUDA_LIBDIR
	fi
	# The last attempt's lines (after a retry with GPTUI_CUDA_LIBDIR, those).
	local libs
	libs=$(awk '/^gpu-check: retrying with/ { s = "" ; next } { s = s $0 "\n" } END { printf "%s", s }' "$WORK/libs.log")
	if [[ $2 == timeout ]] || grep -qE '^lib(cuda|nvrtc|cublas|cublasLt)\.so +(NOT FOUND|INCOMPATIBLE)' <<<"$libs" ||
		! grep -q '^libcuda\.so .*driver CUDA' <<<"$libs"; then
		block gpu "libs $2: $(last_line "$WORK/libs.log")"
		stop_background
	fi
	if grep -q '^libnccl\.so .*NOT FOUND' <<<"$libs"; then
		block nccl "no NCCL: $(grep '^libnccl\.so' <<<"$libs" | cut -c 1-200)"
	fi
}
AFTER_STAGE=after_stage

stages_init "gpu-check $(date -u +%FT%TZ)"

# Before any stage: the binary, and a GPU (else one line, exit 2).
fail_preflight() {
	printf 'preflight\tfail\t0\t%s\t%s\n' "$PREFLIGHT" "$1" >>"$OUT/summary.tsv"
	summary_md
	echo "gpu-check: $1" >&2
	rm -rf "$WORK"
	exit 2
}
if ! "$BIN" help >/dev/null 2>&1; then
	fail_preflight "$BIN is missing or does not run: build it where Go is (scripts/gpu-prepare.sh) and carry .bin with the tree"
fi
version=$(cat .bin/VERSION 2>/dev/null || echo "unknown build")
if [[ $DRY == 1 ]]; then
	gpu="DRY RUN, no GPU used (GPU_CHECK_DRY=1)"
elif gpu=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 1) && [[ -n $gpu ]]; then
	:
else
	# No nvidia-smi, or it failed: the binary says whether a GPU is usable.
	if ! libs=$(timeout 10 "$BIN" gpu libs 2>&1); then
		fail_preflight "no GPU here: $(tail -n 1 <<<"$libs" | cut -c 1-400); run this on the GPU machine, or with --dry to check the script's own logic"
	fi
	gpu="nvidia-smi: $(tail -n 1 <<<"$gpu")"
fi
SUMMARY_TITLE="gpu-check $(date -u +%FT%TZ) on $gpu; gptui $version"
summary_md
echo "$SUMMARY_TITLE"

# llm.c's build needs only the CPU: start it now, niced, so that it is
# done when its stage comes.
# Without nvcc or make (a machine with the libraries but not the
# toolkit) the llmc stage is skipped, saying so, and the rest is checked.
if selected llmc; then
	if [[ $DRY != 1 && ! -f $LLMC/train_gpt2.cu ]]; then
		block llmc "no llm.c source in $LLMC: run scripts/gpu-prepare.sh where the llm.c mirror is, and carry .bin"
	elif tools=$(llmc_tools_missing) && [[ -n $tools ]]; then
		block llmc "no $tools here: llm.c's build needs nvcc (PATH or /usr/local/cuda*/bin) and make; install the CUDA toolkit to compare with llm.c"
	else
		background llmc_build_bg
	fi
fi

if (($# > 0)) && [[ " $* " != *" libs "* ]]; then
	set -- libs "$@" # libs gates the others
fi
run_plan "$@"
stages_done
failed=$(awk -F'\t' 'NR > 1 && ($2 == "fail" || $2 == "timeout")' "$OUT/summary.tsv" | wc -l)
echo "gpu-check: done in $(elapsed "$RUN_START") s, $failed stage(s) failed or timed out; $OUT/summary.md"
((failed == 0)) && [[ ${STAGE_STATUS[libs]} == pass ]]
