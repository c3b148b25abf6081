#!/usr/bin/env bash
# Prepare this machine for `make test-deploy`: podman and friends, a containers.conf that works inside a
# container-less CI machine, and the local base image the CPU Dockerfile builds FROM (no registry can be
# reached here, so the base is bootstrapped from Debian's archive and imported). Idempotent; needs root.
# Prints the environment the test needs (CONTAINERS_CONF, SETPO_BASE_IMAGE), for `eval`.
set -euo pipefail

STATE=${SETPO_PODMAN_STATE:-/var/tmp/setpo-podman}
BASE_IMAGE=${SETPO_BASE_IMAGE:-localhost/setpo-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$STATE"

if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null || ! command -v runc >/dev/null; then
    echo "installing podman, buildah, runc, debootstrap ..." >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap >&2
fi

# runc (crun's seccomp setup fails in nested containers) and explicit ulimits (the defaults exceed this
# machine's hard limits, and every container would fail to start).
cat > "$STATE/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONF
export CONTAINERS_CONF="$STATE/containers.conf"

if ! podman image exists "$BASE_IMAGE"; then
    echo "bootstrapping $BASE_IMAGE from $MIRROR ..." >&2
    rootfs="$STATE/rootfs"
    rm -rf "$rootfs"
    # python3 + its venv module is all the Dockerfile needs from a base (python:3.11-slim-bookworm has both).
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$MIRROR" >&2
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >&2
    rm -rf "$rootfs"
fi

echo "export CONTAINERS_CONF=$CONTAINERS_CONF SETPO_BASE_IMAGE=$BASE_IMAGE"
