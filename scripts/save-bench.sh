#!/usr/bin/env bash
# save-bench.sh: the cost of saving a checkpoint every step, synchronous
# against asynchronous (Engine.save_load.async), on GPT-2 124M, fp32,
# B=4, T=64 (BENCHMARKS.md's CPU step benchmark) with save_steps=1.
#
#   scripts/save-bench.sh [STEPS] [ROUNDS]      (default 12 steps, 3 rounds)
#
# Needs a gptui binary ($BIN, default .bin/gptui: CGO_ENABLED=0 go build
# -o .bin/gptui ./cmd/gptui) and tinyshakespeare tokens in $DATA (default
# /tmp/tss: gptui data prepare --input ../shared/data/tinyshakespeare.txt
# --output /tmp/tss).
# Runs sync and async alternately, ROUNDS times each. Per run it prints the
# median wall time between successive [train] lines from step 2 on (the
# step as the loop sees it, save included), the engine's median step time
# (compute only) and the medians of the checkpoint lines' "blocked the
# step" and background write times. Checkpoints go to $OUT (default
# /tmp/save-bench; about 3 GB with keep_last 2).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.bin/gptui}
DATA=${DATA:-/tmp/tss}
OUT=${OUT:-/tmp/save-bench}
STEPS=${1:-12}
ROUNDS=${2:-3}
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo "save-bench $(date -u +%FT%TZ) steps=$STEPS rounds=$ROUNDS load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-5s %12s %12s %12s %12s\n' mode round loop_step_s engine_step_s blocked_ms write_ms
for round in $(seq 1 "$ROUNDS"); do
	for mode in sync async; do
		async=false; [ "$mode" = async ] && async=true
		rm -rf "$OUT" && mkdir -p "$OUT"
		log="$OUT.$mode.$round.log"
		"$BIN" train -c gpt2-124m -o Data.Train.dataset.input_dir="$DATA" \
			-o Data.Train.dataset.max_seq_len=64 -o Global.global_batch_size=4 \
			-o Global.local_batch_size=4 -o Global.micro_batch_size=4 \
			-o Engine.max_steps="$STEPS" -o Engine.logging_freq=1 -o Engine.eval_freq=0 \
			-o Model.hidden_dropout_prob=0 -o Model.attention_probs_dropout_prob=0 \
			-o Engine.log_dir="$OUT/log" -o Engine.save_load.output_dir="$OUT/ckpt" \
			-o Engine.save_load.save_steps=1 -o Engine.save_load.keep_last=2 \
			-o Engine.save_load.async=$async 2>&1 |
			while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$log"
		loop=$(awk '/\[train\]/ {n++; if (n>2) print $1-prev; prev=$1}' "$log" | median)
		engine=$(sed -n 's/.*median step: \([0-9.]*\) s.*/\1/p' "$log")
		blocked=$(sed -n 's/.*blocked the step \([0-9.]*\) ms.*/\1/p' "$log" | median)
		write=$(sed -n 's/.*write \([0-9.]*\) ms in background.*/\1/p' "$log" | median)
		printf '%-6s %-5s %12s %12s %12s %12s\n' "$mode" "$round" "$loop" "${engine:--}" "$blocked" "$write"
	done
done
rm -rf "$OUT"
