#!/usr/bin/env bash
# Make a local Debian base image for machines that cannot pull from an image registry.
#   sudo bash docker/local-base.sh [IMAGE_NAME] [SUITE]      (default: slapo-base:bookworm bookworm)
# It runs `debootstrap --variant=minbase` against the Debian mirror apt already uses (or MIRROR=...),
# adds python3 + venv + CA certificates (what the official python slim image provides), and
# imports the tree with `docker import`. Then: bash docker/build.sh cpu --base IMAGE_NAME
# bookworm's python3 is 3.11, the version requirements.txt's pins are tested with. ~2-3 minutes.
set -euo pipefail
NAME="${1:-slapo-base:bookworm}"
SUITE="${2:-bookworm}"
DOCKER="${DOCKER:-docker}"

fail() { echo "local-base.sh: ERROR: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "debootstrap needs root; run it with sudo"
command -v debootstrap >/dev/null || fail "debootstrap is not installed (apt-get install debootstrap)"
"$DOCKER" info >/dev/null 2>&1 || fail "'$DOCKER info' failed: is the Docker daemon running?"

# The first Debian mirror apt is configured with (deb822 .sources or one-line sources.list).
if [[ -z "${MIRROR:-}" ]]; then
  MIRROR="$(grep -hoE '^(URIs:\s*|deb\s+(\[[^]]*\]\s+)?)\S+/debian/?(\s|$)' \
              /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
            | grep -oE '\S+/debian/?$' | head -1 || true)"
fi
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

ROOTFS="$(mktemp -d /tmp/slapo-base.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "local-base.sh: debootstrap $SUITE from $MIRROR into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log" >&2; fail "debootstrap failed (full log: $ROOTFS.log)"; }
rm -f "$ROOTFS.log"
# Smaller image: no apt lists, caches or docs (a Dockerfile runs apt-get update itself).
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
echo "local-base.sh: importing as $NAME"
tar -C "$ROOTFS" -c . | "$DOCKER" import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["bash"]' - "$NAME" >/dev/null
"$DOCKER" run --rm "$NAME" python3 --version
"$DOCKER" image ls "$NAME"
