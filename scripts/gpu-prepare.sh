#!/usr/bin/env bash
# gpu-prepare.sh: readies .bin for a session on a GPU machine that has no
# Go and no network. Run it here, where Go is, before the session:
#
#   scripts/gpu-prepare.sh
#
# It writes (all under .bin/, which git ignores):
#   .bin/gptui          the binary, linux/amd64, stripped
#   .bin/VERSION        the commit it was built from, and when
#   .bin/llm.c/         llm.c's source, for scripts/llmc-bench.sh: what
#                       train_gpt2cu needs (Makefile, train_gpt2.cu, llmc/,
#                       LICENSE) exported from a git clone of
#                       github.com/karpathy/llm.c ($LLMC_MIRROR, a bare or
#                       ordinary repository; default the fetched mirror
#                       /work/.mirror/karpathy+llm.c/repo), and its commit
#                       in COMMIT. Never committed here.
#   .bin/data/llmc/     the tokens llm.c trains on: gptui's docs/*.md (the
#                       corpus gptui's own runs train on) as one shard in
#                       llm.c's format, by 'gptui data prepare'
# and checks that the tree and .bin together stay under the 64 MiB that
# travels to the machine. Then: carry .bin, run scripts/gpu-check.sh
# there (docs/gpu.md says how).
set -euo pipefail
cd "$(dirname "$0")/.."
LLMC_MIRROR=${LLMC_MIRROR:-/work/.mirror/karpathy+llm.c/repo}
mkdir -p .bin

echo "gpu-prepare: building .bin/gptui (linux/amd64)"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags='-s -w' -o .bin/gptui ./cmd/gptui
desc=$(git describe --always --dirty 2>/dev/null || echo unknown)
echo "$desc built $(date -u +%FT%TZ)" >.bin/VERSION

rm -rf .bin/llm.c
if git -C "$LLMC_MIRROR" rev-parse --verify -q HEAD >/dev/null 2>&1; then
	mkdir -p .bin/llm.c
	git -C "$LLMC_MIRROR" archive --format=tar HEAD Makefile train_gpt2.cu llmc LICENSE | tar -x -C .bin/llm.c
	git -C "$LLMC_MIRROR" rev-parse HEAD >.bin/llm.c/COMMIT
	echo "gpu-prepare: llm.c $(cut -c 1-12 .bin/llm.c/COMMIT) from $LLMC_MIRROR into .bin/llm.c"
else
	echo "gpu-prepare: no llm.c repository at $LLMC_MIRROR (set LLMC_MIRROR to a clone of github.com/karpathy/llm.c): the llmc stage will be skipped"
fi

rm -rf .bin/data/llmc
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
for f in docs/*.md; do cp "$f" "$docs/$(basename "$f" .md).txt"; done
.bin/gptui data prepare --quiet --input "$docs" --output .bin/data/llmc

# What travels: the tracked and untracked-not-ignored files, and .bin.
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
bin=$(du -sb .bin | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu-prepare: .bin is $(mib "$bin"), the tree $(mib "$tree"): $(mib $((bin + tree))) of the 64 MiB that travels"
if ((bin + tree > 64 * 1048576)); then
	echo "gpu-prepare: over 64 MiB: the device machine will refuse the tree; remove what .bin does not need" >&2
	exit 1
fi
echo "gpu-prepare: ready: on the device machine, carry [\".bin\"] and run: bash scripts/gpu-check.sh"
