#!/usr/bin/env bash
# bullseye-root.sh: creates a Debian 11 (bullseye, glibc 2.31) root for the
# test that runs a node of a 2-node job on an older system than the head
# (cluster's TestBullseyeNode): the pushed gptui must start there.
#
#   scripts/bullseye-root.sh [DIR]
#
# DIR defaults to $GPTUI_BULLSEYE_ROOT, else ~/.cache/gptui/bullseye, the
# path the test looks in. Needs root (debootstrap, and the test chroots into
# it) and deb.debian.org; installs debootstrap with apt-get if it is
# missing. It downloads about 100 MB and takes a few minutes; a DIR that
# already holds a finished root is left as it is.
#
# The root has openssh-server (the test runs the root's own sshd inside a
# chroot on 127.0.0.4) and ca-certificates, and nothing of the host's /etc.
set -euo pipefail
DIR=${1:-${GPTUI_BULLSEYE_ROOT:-$HOME/.cache/gptui/bullseye}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [ -x "$DIR/usr/sbin/sshd" ] && [ -f "$DIR/etc/debian_version" ]; then
	echo "bullseye-root: $DIR already holds Debian $(cat "$DIR/etc/debian_version")"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "bullseye-root: debootstrap needs root; run as root (sudo $0 $*)" >&2
	exit 1
fi
if ! command -v debootstrap >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq debootstrap >/dev/null
fi

# A half-made root from an interrupted run is started over.
rm -rf "$DIR.partial"
mkdir -p "$(dirname "$DIR")"
start=$(date +%s)
debootstrap --variant=minbase --include=openssh-server,ca-certificates \
	bullseye "$DIR.partial" "$MIRROR"
# The package cache is not needed to run anything.
rm -rf "$DIR.partial/var/cache/apt/archives/"*.deb
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
echo "bullseye-root: Debian $(cat "$DIR/etc/debian_version") in $DIR," \
	"$(du -sh "$DIR" | cut -f1), in $(($(date +%s) - start)) s"
