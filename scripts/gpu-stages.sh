# shellcheck shell=bash
# gpu-stages.sh: the stage runner that scripts/gpu-check.sh and
# scripts/llmc-bench.sh share (sourced, not run).
#
# A run is a list of stages planned up front (plan_stage NAME LIMIT NEEDS
# FUNC FIGURES). Each stage runs its function under its own time limit
# (timeout(1), in a process group of its own: SIGQUIT at the limit, so a
# Go program prints every goroutine's stack, then SIGKILL 5 s later). As
# each stage ends its row is appended to $OUT/summary.tsv and
# $OUT/summary.md is written again, so a run cut off at any point still
# answers for every stage that ended; a run stopped by a signal adds a
# row for the stage it stopped and "skipped" rows for the rest. Every
# stage's output goes, as it is printed, to $OUT/stages.log under a
# "==== NAME" header: one file, because the device machine returns at
# most 8 files from $OUT.
#
# summary.tsv: one header line, then per stage
#   stage  status  seconds  limit_s  figures
# status is pass, fail, timeout or skipped; figures are the stage's key
# figures as key=value words (or, skipped, the reason).
#
# Environment:
#   OUT                 where the summary and the log go (default ./gpu-check-out)
#   GPU_CHECK_DRY=1     dry mode: the commands that need a GPU (and nvcc)
#                       are stand-ins that print what the real ones print;
#                       training runs for real on the CPU at a tiny shape;
#                       the limits are scaled by 0.1, but a stage gets at
#                       least 3 s, or its DRY_FLOOR (set for the stages
#                       that run gptui for real). It checks the scripts'
#                       own logic on a machine without a GPU.
#   GPU_CHECK_SCALE     multiplies every limit (default 1, dry 0.1)
#   GPU_CHECK_DEADLINE  seconds the whole run may take (default 540, not
#                       scaled): a stage gets at most what is left, and is
#                       skipped when under 2 s (scaled) is
#   GPU_CHECK_DRY_HANG  (dry) a stage whose command hangs, to see its limit
#   GPU_CHECK_DRY_FAIL  (dry) a stage whose command fails
#   GPU_CHECK_DRY_MISSING  (dry) tools to take as absent, of "nvcc" and
#                       "make", space-separated: gpu-check.sh then skips
#                       the llmc stage, saying so, as on a machine with the
#                       libraries but not the CUDA toolkit

OUT=${OUT:-gpu-check-out}
DRY=${GPU_CHECK_DRY:-0}
[[ $DRY == 1 ]] && DEFAULT_SCALE=0.1 || DEFAULT_SCALE=1
SCALE=${GPU_CHECK_SCALE:-$DEFAULT_SCALE}
DEADLINE=${GPU_CHECK_DEADLINE:-540}
export OUT DRY

# The plan, in order: names, limits (s, unscaled), needs, functions, figure
# parsers. NEEDS is a space-separated list of tags a stage needs (gpu,
# nccl, llmc); block TAG REASON makes every later stage that needs TAG
# skipped with REASON.
STAGE_NAMES=() STAGE_LIMITS=() STAGE_NEEDS=() STAGE_FUNCS=() STAGE_FIGS=()
declare -A BLOCKED=() STAGE_STATUS=() DRY_FLOOR=()
RUN_START=0
CURRENT_STAGE='' CURRENT_PID='' CURRENT_START='' CURRENT_LIMIT=''
BACKGROUND_PIDS=()

plan_stage() { # NAME LIMIT NEEDS FUNC FIGURES
	STAGE_NAMES+=("$1") STAGE_LIMITS+=("$2") STAGE_NEEDS+=("$3") STAGE_FUNCS+=("$4") STAGE_FIGS+=("$5")
}

# block TAG REASON: the later stages that need TAG are skipped, with
# REASON (the first reason given for a tag stays).
block() { [[ -n ${BLOCKED[$1]:-} ]] || BLOCKED[$1]=$2; }

# Times are kept as integer milliseconds (bash has no floating point;
# awk would cost a process each time).

# ms SECONDS: "12", "0.1" or "3.25" as milliseconds.
ms() {
	local i=${1%%.*} f=
	[[ $1 == *.* ]] && f=${1#*.}
	f=${f}000
	echo $((10#${i:-0} * 1000 + 10#${f:0:3}))
}

# secs MS [DECIMALS]: milliseconds as seconds, with 1 (or 2) decimals.
secs() {
	if [[ ${2:-1} == 2 ]]; then
		printf '%d.%02d' $(($1 / 1000)) $(($1 % 1000 / 10))
	else
		printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100))
	fi
}

# now_ms: the time in milliseconds.
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

# elapsed START_MS: seconds since START_MS, one decimal.
elapsed() { secs $(($(now_ms) - $1)); }

# scaled LIMIT: LIMIT·SCALE in milliseconds.
scaled_ms() { echo $(($(ms "$1") * $(ms "$SCALE") / 1000)); }

# scaled LIMIT: LIMIT·SCALE seconds, two decimals.
scaled() { secs "$(scaled_ms "$1")" 2; }

# plan_total: the sum of the planned stages' limits (unscaled).
plan_total() {
	local t=0 l
	for l in "${STAGE_LIMITS[@]}"; do t=$((t + l)); done
	echo "$t"
}

# check_budget OVERHEAD: refuses a plan whose limits and fixed OVERHEAD
# (seconds outside the stages) exceed the deadline.
check_budget() {
	local total=$(($(plan_total) + $1))
	if ((total > DEADLINE)); then
		echo "$(basename "$0"): the stage limits and ${1} s of overhead sum to ${total} s, over the ${DEADLINE} s deadline: lower a limit in the plan" >&2
		exit 2
	fi
}

summary_init() { # TITLE
	mkdir -p "$OUT"
	printf 'stage\tstatus\tseconds\tlimit_s\tfigures\n' >"$OUT/summary.tsv"
	: >"$OUT/stages.log"
	SUMMARY_TITLE=$1
	summary_md
}

# summary_md writes $OUT/summary.md from summary.tsv and the plan: the
# title, the plan's limits, a table of the stages that ended.
summary_md() {
	{
		echo "# $SUMMARY_TITLE"
		echo
		echo "Plan: ${#STAGE_NAMES[@]} stages, limits summing to $(plan_total) s (×$SCALE), deadline ${DEADLINE} s; full output in stages.log."
		echo
		echo "| stage | status | seconds | limit s | figures |"
		echo "| --- | --- | ---: | ---: | --- |"
		tail -n +2 "$OUT/summary.tsv" | awk -F'\t' '{ gsub(/\|/, "\\|", $5); printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
	} >"$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
}

row() { # STAGE STATUS SECONDS LIMIT FIGURES
	printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$OUT/summary.tsv"
	summary_md
	printf '%-13s %-7s %6s s (limit %s s)  %s\n' "$1" "$2" "$3" "$4" "$5"
}

# figure STAGE KEY: the value of KEY=... in STAGE's row, or "".
figure() {
	awk -F'\t' -v s="$1" -v k="$2" '$1 == s { n = split($5, w, " "); for (i = 1; i <= n; i++) if (index(w[i], k "=") == 1) v = substr(w[i], length(k) + 2) } END { print v }' "$OUT/summary.tsv"
}

# run_stage I: runs the plan's stage I, appends its row.
run_stage() {
	local i=$1 name=${STAGE_NAMES[$1]} limit_ms limit need reason='' left
	limit_ms=$(scaled_ms "${STAGE_LIMITS[$i]}")
	for need in ${STAGE_NEEDS[$i]}; do
		if [[ -n ${BLOCKED[$need]:-} ]]; then
			reason=${BLOCKED[$need]}
			break
		fi
	done
	if [[ $DRY == 1 ]] && ((limit_ms < ${DRY_FLOOR[$name]:-3} * 1000)); then
		limit_ms=$((${DRY_FLOOR[$name]:-3} * 1000))
	fi
	if [[ -z $reason ]]; then
		left=$(($(ms "$DEADLINE") - $(now_ms) + RUN_START))
		if ((left < $(scaled_ms 2))); then
			reason="no time left before the ${DEADLINE} s deadline"
		elif ((left < limit_ms)); then
			limit_ms=$left
		fi
	fi
	limit=$(secs "$limit_ms" 2)
	if [[ -n $reason ]]; then
		printf '==== %s: skipped: %s\n' "$name" "$reason" >>"$OUT/stages.log"
		row "$name" skipped 0 "$limit" "$reason"
		STAGE_STATUS[$name]=skipped
		return
	fi
	local log="$OUT/stages.log" off
	printf '==== %s (limit %s s) %s\n' "$name" "$limit" "$(date -u +%FT%TZ)" >>"$log"
	off=$(stat -c %s "$log")
	CURRENT_STAGE=$name CURRENT_START=$(now_ms) CURRENT_LIMIT=$limit
	# shellcheck disable=SC2016 # $0 is the inner bash's
	if [[ $DRY == 1 && $name == "${GPU_CHECK_DRY_HANG:-}" ]]; then
		timeout -s QUIT -k 2 "$limit" bash -c 'echo "dry: $0 hangs (GPU_CHECK_DRY_HANG)"; exec sleep 100000' "$name" >>"$log" 2>&1 &
	elif [[ $DRY == 1 && $name == "${GPU_CHECK_DRY_FAIL:-}" ]]; then
		timeout -s QUIT -k 2 "$limit" bash -c 'echo "gptui: $0: failed on purpose (GPU_CHECK_DRY_FAIL)"; exit 2' "$name" >>"$log" 2>&1 &
	else
		timeout -s QUIT -k 5 "$limit" bash -c "set -o pipefail; $(declare -f); ${STAGE_FUNCS[$i]}" >>"$log" 2>&1 &
	fi
	CURRENT_PID=$!
	wait "$CURRENT_PID"
	local rc=$? secs status figs
	CURRENT_PID=''
	secs=$(elapsed "$CURRENT_START")
	tail -c +$((off + 1)) "$log" >"$WORK/$name.log"
	case $rc in
	0) status=pass ;;
	124 | 137) status=timeout ;;
	*) status=fail ;;
	esac
	figs=$(${STAGE_FIGS[$i]} "$WORK/$name.log" "$rc" 2>&1 | tr '\t\n' '  ' | sed 's/ *$//')
	if [[ $status == timeout ]]; then
		figs="cut at the ${limit} s limit; last line: $(last_line "$WORK/$name.log")${figs:+. $figs}"
	elif [[ $status == fail ]]; then
		figs="exit $rc: $(last_line "$WORK/$name.log")${figs:+. $figs}"
	fi
	printf '==== %s: %s in %s s (exit %s)\n' "$name" "$status" "$secs" "$rc" >>"$log"
	row "$name" "$status" "$secs" "$limit" "$figs"
	CURRENT_STAGE=''
	STAGE_STATUS[$name]=$status
}

# last_line FILE: FILE's last line that is not empty and not a goroutine
# dump's, shortened to 240 characters.
last_line() {
	grep -v -e '^[[:space:]]*$' -e '^goroutine ' -e '^	' -e '^[a-zA-Z0-9_./*()-]*(.*)$' -e '^SIGQUIT' -e '^PC=' -e '^created by ' \
		-e '^[a-z0-9]* *0x[0-9a-f]*$' -e '^-----' -e '^exit status ' "$1" 2>/dev/null | tail -n 1 | cut -c 1-240
}

# run_plan [NAME...]: runs the plan's stages in order, those named or
# all; a stage not named is left out, without a row. After each,
# $AFTER_STAGE NAME STATUS runs, if set (in this shell: it may block).
run_plan() {
	local i n w sel=()
	for i in "${!STAGE_NAMES[@]}"; do
		if (($# == 0)); then
			sel+=("$i")
			continue
		fi
		for w in "$@"; do [[ $w == "${STAGE_NAMES[$i]}" ]] && sel+=("$i"); done
	done
	for n in "${!sel[@]}"; do
		NEXT_STAGES=()
		for i in "${sel[@]:$((n + 1))}"; do NEXT_STAGES+=("${STAGE_NAMES[$i]}"); done
		i=${sel[$n]}
		run_stage "$i"
		[[ -n ${AFTER_STAGE:-} ]] && $AFTER_STAGE "${STAGE_NAMES[$i]}" "${STAGE_STATUS[${STAGE_NAMES[$i]}]}"
	done
	stop_background
}

# stop_background ends the background jobs started with background.
stop_background() {
	local p
	for p in "${BACKGROUND_PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	BACKGROUND_PIDS=()
}

# on_signal SIG: the run was stopped: the running stage's row (timeout,
# with how long it ran), skipped rows for the stages not run, and exit.
on_signal() {
	trap - TERM INT HUP
	if [[ -n $CURRENT_PID ]]; then
		kill -TERM "$CURRENT_PID" 2>/dev/null
		sleep 1
		kill -KILL -- "-$CURRENT_PID" 2>/dev/null
		kill -KILL "$CURRENT_PID" 2>/dev/null
	fi
	stop_background
	if [[ -n $CURRENT_STAGE ]]; then
		printf '==== %s: stopped by SIG%s after %s s\n' "$CURRENT_STAGE" "$1" "$(elapsed "$CURRENT_START")" >>"$OUT/stages.log"
		row "$CURRENT_STAGE" timeout "$(elapsed "$CURRENT_START")" "$CURRENT_LIMIT" "the whole run was stopped (SIG$1) during this stage"
		local n
		for n in "${NEXT_STAGES[@]}"; do
			row "$n" skipped 0 - "the run was stopped (SIG$1) before this stage"
		done
	fi
	rm -rf "$WORK"
	case $1 in INT) exit 130 ;; HUP) exit 129 ;; *) exit 143 ;; esac
}

# stages_init TITLE: the work folder, the summary, the signal traps.
stages_init() {
	RUN_START=$(now_ms)
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-stages.XXXXXX")
	export WORK
	ulimit -c 0 # SIGQUIT at a limit must not leave core files
	summary_init "$1"
	NEXT_STAGES=("${STAGE_NAMES[@]}")
	trap 'stop_background; rm -rf "$WORK"' EXIT
	trap 'on_signal TERM' TERM
	trap 'on_signal INT' INT
	trap 'on_signal HUP' HUP
}

stages_done() {
	stop_background
	rm -rf "$WORK"
}

# background CMD...: runs CMD in the background (ended when the run ends
# or is stopped).
background() {
	"$@" &
	BACKGROUND_PIDS+=($!)
}
