#!/usr/bin/env bash
# make dist-check: what a user gets from dist/ works: the wheel with the controller extra installs
# into a fresh venv at the tested versions (dist's constraints file) and runs (--version names the
# release, check validates a configuration, the controller's libraries import, no development tool
# came with it), the packaged charts lint and render, dist/INSTALL.txt gives a command for every
# artifact, and dist/SHA256SUMS lists every artifact with the checksum it has (checked first, as a
# user checks a download).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
HELM=$(bash scripts/get-helm.sh | tail -n 1)
WHEEL="dist/drain_router-$VERSION-py3-none-any.whl"
CHART="dist/drain-router-$VERSION.tgz"
CONTROLLER_CHART="dist/drain-router-controller-$VERSION.tgz"
CONSTRAINTS="dist/drain-router-$VERSION-constraints.txt"
for f in "$WHEEL" "dist/drain_router-$VERSION.tar.gz" "$CHART" "$CONTROLLER_CHART" "$CONSTRAINTS" dist/INSTALL.txt dist/SHA256SUMS; do
    [ -f "$f" ] || { echo "dist-check: missing $f (run make dist)" >&2; exit 1; }
done
bash scripts/sha256sums.sh verify dist || { echo "dist-check: dist/SHA256SUMS does not hold (run make dist)" >&2; exit 1; }

venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet -c "$CONSTRAINTS" "$WHEEL[controller]"
"$venv/bin/pip" check >/dev/null
"$venv/bin/python" -c 'import kopf, kubernetes_asyncio' || { echo "dist-check: the controller extra did not install" >&2; exit 1; }
dev_tools=$("$venv/bin/pip" list --format=freeze | grep -iE '^(pytest|hypothesis|mypy|ruff|matplotlib|rich|build|kmock)==' || true)
[ -z "$dev_tools" ] || { echo "dist-check: the wheel pulled in $dev_tools" >&2; exit 1; }
"$venv/bin/drain-router" --version | grep -q "$VERSION" || { echo "dist-check: --version does not say $VERSION" >&2; exit 1; }
"$venv/bin/drain-router" check --upstream http://127.0.0.1:8000 --termination-grace-secs 60 >/dev/null
if "$venv/bin/drain-router" check --upstream http://127.0.0.1:8000 --shutdown-drain-secs 1801 >/dev/null 2>&1; then
    echo "dist-check: check accepted an invalid configuration" >&2; exit 1
fi
for chart in "$CHART" "$CONTROLLER_CHART"; do
    "$HELM" lint --strict "$chart" >/dev/null
    "$HELM" template release "$chart" --namespace models >/dev/null
done
for f in dist/*; do
    name=$(basename "$f")
    [ "$name" = INSTALL.txt ] && continue
    grep -qxF "$name" dist/INSTALL.txt || { echo "dist-check: dist/INSTALL.txt has no entry for $name" >&2; exit 1; }
done
echo "dist-check: $WHEEL[controller] installs and runs; INSTALL.txt covers $(($(ls dist | wc -l) - 1)) artifacts; SHA256SUMS matches all $(($(ls dist | wc -l) - 1)) other files; $CHART and $CONTROLLER_CHART lint and render"
