#!/usr/bin/env bash
# gpu-profile.sh: where the GPU time of a GPT-2 124M training step goes,
# kernel by kernel, at gpu-check.sh's train-124m shape (B=16, T=1024,
# bf16), on a machine with an NVIDIA GPU and Nsight Compute (ncu); with
# --llmc, llm.c's train_gpt2cu at the same shape too, side by side:
#
#   scripts/gpu-profile.sh [--llmc] [STEPS]   (default 2 steps; limit
#                                             $LIMIT s a program, 150)
#
# ncu times every kernel the steps launch (one metric,
# gpu__time_duration.sum, so one pass per kernel; the clocks and caches
# left as they are: --clock-control none --cache-control none). The
# kernels are grouped by name (template arguments cut) into
# $OUT/kernels.tsv (llm.c's: llmc-kernels.tsv) and a table on stdout:
# launches, milliseconds, share of the profiled kernel time, and the same
# per step; every launch in order is in $OUT/raw.csv.gz (llmc-raw.csv.gz).
# The sum of the kernel times against the step time without the profiler
# (gpu-check's train-124m) is the time the GPU sat idle between kernels.
# llm.c is built first (scripts/llmc-bench.sh --build, in the background
# while gptui is profiled).
#
# Built for issue 37 (GPU speed): run it in the same call as gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-./gpu-profile-out}
BIN=${BIN:-.bin/gptui}
LLMC_TOO=0
if [[ ${1:-} == --llmc ]]; then
	LLMC_TOO=1
	shift
fi
STEPS=${1:-2}
LIMIT=${LIMIT:-150}
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")

ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
if [[ -z $ncu || ! -x $ncu ]]; then
	echo "gpu-profile: ncu not found (PATH, /opt/nvidia/nsight-compute/*, /usr/local/cuda/bin)"
	exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# profile LABEL PREFIX CMD...: CMD under ncu, its output in $OUT/PREFIXrun.log,
# the kernels grouped into $OUT/PREFIXkernels.tsv and printed.
profile() {
	local label=$1 prefix=$2
	shift 2
	echo "gpu-profile: $ncu, $STEPS steps of $label, 124M B=16 T=1024 bf16 (limit $LIMIT s)"
	timeout -k 5 "$LIMIT" "$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum \
		--export "$work/${prefix}prof" --force-overwrite "$@" >"$OUT/${prefix}run.log" 2>&1
	local rc=$?
	echo "gpu-profile: ncu exit $rc (its output and the run's: ${prefix}run.log)"
	tail -n 3 "$OUT/${prefix}run.log"
	if [[ ! -s $work/${prefix}prof.ncu-rep ]]; then
		echo "gpu-profile: no report written for $label"
		return 1
	fi
	"$ncu" --import "$work/${prefix}prof.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum >"$work/${prefix}raw.csv" 2>>"$OUT/${prefix}run.log"
	gzip -c "$work/${prefix}raw.csv" >"$OUT/${prefix}raw.csv.gz"
	STEPS=$STEPS python3 - "$work/${prefix}raw.csv" "$OUT/${prefix}kernels.tsv" <<'EOF'
import csv, os, re, sys
rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
name, dur = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
unit = rows[1][dur] if len(rows) > 1 else ""
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}.get(unit)
if scale is None:
    sys.exit(f"gpu-profile: unknown unit {unit!r} of gpu__time_duration.sum")
by = {}
for r in rows[2:]:
    if len(r) <= max(name, dur):
        continue
    try:
        t = float(r[dur].replace(",", "")) * scale
    except ValueError:
        continue
    n = re.sub(r"^void ", "", re.sub(r"<.*", "", r[name]).split("(")[0].strip())
    c, s = by.get(n, (0, 0.0))
    by[n] = (c + 1, s + t)
total = sum(s for _, s in by.values())
steps = int(os.environ.get("STEPS", "1"))
with open(sys.argv[2], "w") as f:
    f.write("kernel\tlaunches\tms\tshare\tms_per_step\n")
    for n, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        f.write(f"{n}\t{c}\t{s:.3f}\t{s / total:.4f}\t{s / steps:.3f}\n")
print(f"{'kernel':60s} {'launches':>8s} {'ms':>9s} {'share':>6s}")
for n, (c, s) in sorted(by.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{n[:60]:60s} {c:8d} {s:9.3f} {100 * s / total:5.1f}%")
print(f"{'all kernels':60s} {sum(c for c, _ in by.values()):8d} {total:9.3f}  ({total / steps:.3f} ms per step over {steps} steps)")
EOF
}

if ((LLMC_TOO)); then
	scripts/llmc-bench.sh --build >"$OUT/llmc-build.log" 2>&1 &
	build=$!
fi
profile gptui "" "$BIN" train -c gpt2-124m -o Global.device=gpu -o Engine.mix_precision.dtype=bf16 \
	-o Global.global_batch_size=16 -o Global.local_batch_size=16 -o Global.micro_batch_size=16 \
	-o Data.Train.dataset.max_seq_len=1024 -o Data.Train.dataset.input_dir= \
	-o Model.hidden_dropout_prob=0 -o Model.attention_probs_dropout_prob=0 \
	-o Engine.eval_freq=0 -o Engine.save_load.save_steps=0 -o Engine.log_dir="$work/log" \
	-o Engine.save_load.output_dir="$work/output" \
	-o Engine.max_steps="$STEPS" -o Engine.logging_freq=1
rc=$?
if ((LLMC_TOO)); then
	if ! wait $build; then
		echo "gpu-profile: the llm.c build failed: $(tail -n 1 "$OUT/llmc-build.log")"
		exit 1
	fi
	llmc=$(readlink -f "${LLMC:-.bin/llm.c}")
	data=$(readlink -f "${LLMC_DATA:-.bin/data/llmc}")
	(cd "$llmc" && LD_LIBRARY_PATH="$(cat .link/ld_library_path 2>/dev/null):${LD_LIBRARY_PATH:-}" \
		profile "llm.c train_gpt2cu" llmc- ./train_gpt2cu -i "$data/*.bin" -j "$data/*.bin" -e d12 -b 16 -t 1024 \
		-x "$STEPS" -r 0 -v 100000 -m 1 -s 0 -h 0) || rc=1
fi
exit $rc
