#!/usr/bin/env bash
# llama-bench.sh: the CPU training step of GPT-2 124M beside a 124M-sized
# Llama, on the same data and batch, run by turns (GPT-2, Llama, GPT-2, …)
# so that both see the same drift of a shared machine.
#
#   scripts/llama-bench.sh [ROUNDS [STEPS]]   default 4 rounds of 20 steps
#
# The Llama is gpt2-124m with Model.family=llama and 4 key/value heads:
# hidden 768, 12 layers, 12 query heads, SwiGLU 2048 (the Llama default
# for hidden 768), untied head (the Llama default), rotary theta 10000.
# Both: B=4, T=64, fp32, no dropout, tinyshakespeare tokenized with
# GPT-2's tokenizer ($TSS_TEXT, default ../shared/data/tinyshakespeare.txt),
# the threads gptui chooses (GPTUI_THREADS to set them). Each run's
# `[done]` line gives the median step over steps 1…STEPS−1 and its MFU
# (against the sgemm peak measured at start-up); a line per run, then the
# medians over the rounds. Builds ./gptui if it is missing; work files go
# to a temporary directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-4}
STEPS=${2:-20}
TSS_TEXT=${TSS_TEXT:-../shared/data/tinyshakespeare.txt}
[[ -x ./gptui ]] || CGO_ENABLED=0 go build -o gptui ./cmd/gptui
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
./gptui data prepare --input "$TSS_TEXT" --output "$work/tss" >/dev/null

common=(-c gpt2-124m -o Data.Train.dataset.input_dir="$work/tss"
	-o Data.Train.dataset.max_seq_len=64 -o Global.global_batch_size=4
	-o Global.local_batch_size=4 -o Global.micro_batch_size=4
	-o Engine.max_steps="$STEPS" -o Engine.logging_freq=10 -o Engine.eval_freq=0
	-o Engine.save_load.save_steps=0 -o Model.hidden_dropout_prob=0
	-o Model.attention_probs_dropout_prob=0 -o Engine.log_dir="$work/log")
llama=(-o Model.family=llama -o Model.num_key_value_heads=4)

# run NAME ARGS…: one training run; prints NAME, the median step (s), the
# MFU (%), the start-up peak the MFU is against (GFLOP/s) and the load
# average at its end.
run() {
	local name=$1 out step mfu peak
	shift
	out=$(./gptui train "${common[@]}" "$@" 2>&1)
	read -r step mfu < <(grep '^\[done\]' <<<"$out" | sed -E 's/.*median step: ([0-9.]+) s.*mfu: ([0-9.]+)%.*/\1 \2/')
	peak=$(grep '^\[backend\]' <<<"$out" | sed -E 's/.*peak ([0-9.]+) GFLOP.*/\1/')
	printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$step" "$mfu" "$peak" "$(cut -d' ' -f1-3 /proc/loadavg)"
}

echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $ROUNDS rounds of $STEPS steps"
printf 'model\tstep_s\tmfu_%%\tpeak_GFLOPs\tload\n'
for ((r = 1; r <= ROUNDS; r++)); do
	run gpt2 | tee -a "$work/rows"
	run llama "${llama[@]}" | tee -a "$work/rows"
done
# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
for m in gpt2 llama; do
	echo "median $m: step $(awk -v m=$m '$1 == m { print $2 }' "$work/rows" | median) s, MFU $(awk -v m=$m '$1 == m { print $3 }' "$work/rows" | median)%"
done
# Llama's step over GPT-2's, round by round.
echo "median llama/gpt2 step: $(paste - - <"$work/rows" | awk '{ print $9 / $2 }' | median)"
