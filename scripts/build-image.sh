#!/usr/bin/env bash
# Build the drain-router image with buildah (no Docker daemon needed).
#
#   scripts/build-image.sh                 # local Debian base (no registry needed), then the image
#   BASE=python:3.11.14-slim-bookworm scripts/build-image.sh   # official base, where a registry is reachable
#
# Without BASE, a minimal Debian bookworm rootfs (python3, python3-venv, ca-certificates) is made
# once with debootstrap, cached as .cache/image/bookworm-rootfs.tar, and committed as the local
# image localhost/drain-router-base:bookworm. Re-running reuses both. The result is tagged
# localhost/drain-router:<version from pyproject.toml>.
#
# Environment:
#   BASE            base image for the Dockerfile's ARG BASE (default: the local Debian base)
#   MIRROR          Debian mirror for debootstrap (default: the first Debian URI apt uses here)
#   RUNTIME         OCI runtime path (default: runc on PATH)
#   STORAGE_DRIVER  buildah storage driver (buildah's default; set vfs if overlay fails)
#   EXTRA_CA_DIR    PEM *.crt files the local base should trust as well (default: this host's
#                   /usr/local/share/ca-certificates, so pip works behind a TLS-inspecting proxy;
#                   set it empty to skip). The official-base path never adds certificates.
#   REBUILD_BASE=1  discard the cached rootfs and the local base image, and make them again
#   GIT_REF         build from this commit (git archive) instead of the working tree, e.g. HEAD:
#                   reproducible, and without others' uncommitted edits or __pycache__ in the context
#   IMAGE           tag to build (default: localhost/drain-router:<version>)
# Needs root (debootstrap, buildah's rootful storage).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE="$ROOT/.cache/image"
LOCAL_BASE=localhost/drain-router-base:bookworm
SUITE=bookworm

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'build-image: FAILED: %s\n' "$*" >&2; exit 1; }
trap 'rc=$?; [ $rc -eq 0 ] || printf "build-image: FAILED (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2' EXIT

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and rootful buildah need it)"
cd "$ROOT"

VERSION=$(python3 -c 'import tomllib,sys; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
IMAGE=${IMAGE:-localhost/drain-router:$VERSION}
grep -qxF "ARG VERSION=$VERSION" Dockerfile \
    || die "Dockerfile's ARG VERSION (its pinned install and version label) is not $VERSION (pyproject.toml's version)"

# --- tools -------------------------------------------------------------------------------------
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
if [ -z "${BASE:-}" ]; then command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap); fi
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
export PATH="$PATH:/usr/sbin:/sbin"
RUNTIME=${RUNTIME:-$(command -v runc)}
[ -x "$RUNTIME" ] || die "no OCI runtime at '$RUNTIME'"
echo "buildah $(buildah --version | awk '{print $3}'), runtime $RUNTIME ($("$RUNTIME" --version | head -1))"

# --- local base --------------------------------------------------------------------------------
debian_mirror() {
    # The first Debian (non-security) archive URI apt is configured with, deb822 or one-line style.
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -nE 's/^URIs:[[:space:]]*//p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' \
        | tr ' ' '\n' | grep -E '/debian/?$' | head -1
}

build_local_base() {
    local tar="$CACHE/$SUITE-rootfs.tar" tmp="$CACHE/rootfs.tmp"
    mkdir -p "$CACHE"
    if [ "${REBUILD_BASE:-0}" = 1 ]; then
        step "REBUILD_BASE=1: discarding the cached rootfs and $LOCAL_BASE"
        rm -rf "$tar" "$tmp"
        buildah rmi "$LOCAL_BASE" >/dev/null 2>&1 || true
    fi
    if buildah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
        echo "local base $LOCAL_BASE exists: reusing it (REBUILD_BASE=1 to remake)"
        return
    fi
    if [ ! -s "$tar" ]; then
        local mirror=${MIRROR:-$(debian_mirror)}
        [ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list*; set MIRROR=http://..."
        step "debootstrap --variant=minbase $SUITE from $mirror (a few minutes, once)"
        command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || die "debootstrap not installed"
        rm -rf "$tmp"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$SUITE" "$tmp" "$mirror" > "$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
        chroot "$tmp" python3 -c 'import ensurepip, venv, sys; assert sys.version_info >= (3, 11)' \
            || die "the rootfs has no usable python3 >= 3.11 with venv"
        # Slim it like a base image: no package caches or lists, no host resolver config.
        rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/* "$tmp"/etc/resolv.conf \
               "$tmp"/dev/* "$tmp"/proc/* "$tmp"/sys/* "$tmp"/tmp/* "$tmp"/var/log/*.log
        tar --numeric-owner --xattrs -C "$tmp" -cf "$tar.part" .
        mv "$tar.part" "$tar"
        rm -rf "$tmp"
        echo "cached rootfs: $tar ($(du -h "$tar" | cut -f1))"
    else
        echo "cached rootfs: $tar (reusing)"
    fi
    step "importing the rootfs as $LOCAL_BASE"
    local ctr mnt
    ctr=$(buildah from scratch)
    mnt=$(buildah mount "$ctr")
    tar --numeric-owner --xattrs -C "$mnt" -xf "$tar" || { buildah rm "$ctr" >/dev/null; die "could not unpack $tar"; }
    local ca_dir=${EXTRA_CA_DIR-/usr/local/share/ca-certificates} certs=()
    [ -n "$ca_dir" ] && [ -d "$ca_dir" ] && mapfile -t certs < <(find "$ca_dir" -maxdepth 1 -name '*.crt' | sort)
    if [ ${#certs[@]} -gt 0 ]; then
        echo "adding ${#certs[@]} locally trusted CA certificate(s) from $ca_dir to the base's trust store"
        cp "${certs[@]}" "$mnt/usr/local/share/ca-certificates/"
        chroot "$mnt" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the base"
    fi
    buildah umount "$ctr" >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash --os linux --arch amd64 \
        --label "org.opencontainers.image.description=minimal Debian $SUITE with python3 + python3-venv (debootstrap minbase)" \
        "$ctr"
    buildah commit --rm --quiet "$ctr" "$LOCAL_BASE" >/dev/null
    echo "committed $LOCAL_BASE ($(buildah images --noheading --format '{{.ID}}' "$LOCAL_BASE"))"
}

bud_args=()
if [ -z "${BASE:-}" ]; then
    build_local_base
    BASE=$LOCAL_BASE
    bud_args+=(--pull-never)   # local only: nothing to pull from
fi

# --- the image ---------------------------------------------------------------------------------
CONTEXT=.
if [ -n "${GIT_REF:-}" ]; then
    CONTEXT=$(mktemp -d)
    trap 'rc=$?; rm -rf "$CONTEXT"; [ $rc -eq 0 ] || printf "build-image: FAILED (exit %s) at line %s: %s\n" "$rc" "$LINENO" "$BASH_COMMAND" >&2' EXIT
    git archive "$GIT_REF" | tar -x -C "$CONTEXT" || die "git archive $GIT_REF failed"
    echo "context: $GIT_REF ($(git rev-parse --short "$GIT_REF")) unpacked from git"
fi
step "buildah bud --build-arg BASE=$BASE -t $IMAGE $CONTEXT"
start=$(date +%s)
# Host networking for RUN steps: pip fetches the pinned wheels from the package index.
buildah bud --runtime "$RUNTIME" --network host --layers --force-rm "${bud_args[@]}" \
    --build-arg "BASE=$BASE" -t "$IMAGE" -f "$CONTEXT/Dockerfile" "$CONTEXT"
echo
echo "built $IMAGE in $(( $(date +%s) - start ))s"
buildah inspect --type image --format \
    'user={{.OCIv1.Config.User}} entrypoint={{.OCIv1.Config.Entrypoint}} cmd={{.OCIv1.Config.Cmd}} stopsignal={{.OCIv1.Config.StopSignal}}' \
    "$IMAGE"; echo
buildah images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' | grep -E "drain-router(-base)?:" || true
