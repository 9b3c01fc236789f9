#!/usr/bin/env bash
# make dist-check: what a user gets from dist/ works: the wheel installs into a fresh venv and runs
# (--version names the release, check validates a configuration), and the packaged chart lints and
# renders.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
HELM=$(bash scripts/get-helm.sh | tail -n 1)
WHEEL="dist/drain_router-$VERSION-py3-none-any.whl"
CHART="dist/drain-router-$VERSION.tgz"
CONTROLLER_CHART="dist/drain-router-controller-$VERSION.tgz"
for f in "$WHEEL" "dist/drain_router-$VERSION.tar.gz" "$CHART" "$CONTROLLER_CHART"; do
    [ -f "$f" ] || { echo "dist-check: missing $f (run make dist)" >&2; exit 1; }
done

venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "$WHEEL"
"$venv/bin/drain-router" --version | grep -q "$VERSION" || { echo "dist-check: --version does not say $VERSION" >&2; exit 1; }
"$venv/bin/drain-router" check --upstream http://127.0.0.1:8000 --termination-grace-secs 60 >/dev/null
if "$venv/bin/drain-router" check --upstream http://127.0.0.1:8000 --shutdown-drain-secs 1801 >/dev/null 2>&1; then
    echo "dist-check: check accepted an invalid configuration" >&2; exit 1
fi
for chart in "$CHART" "$CONTROLLER_CHART"; do
    "$HELM" lint --strict "$chart" >/dev/null
    "$HELM" template release "$chart" --namespace models >/dev/null
done
echo "dist-check: $WHEEL installs and runs; $CHART and $CONTROLLER_CHART lint and render"
