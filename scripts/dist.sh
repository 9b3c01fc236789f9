#!/usr/bin/env bash
# make dist: the release artifacts of one version, in dist/:
#   drain_router-<v>-py3-none-any.whl, drain_router-<v>.tar.gz   (python -m build)
#   drain-router-<v>.tgz, drain-router-controller-<v>.tgz        (helm package: the two charts)
#   drain-router-<v>.oci.tar   only with DIST_IMAGE=1: the image as an OCI archive (needs root and
#                              buildah; built by scripts/build-image.sh)
# The version is pyproject.toml's; the chart's version and appVersion must equal it (a test checks).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
HELM=$(bash scripts/get-helm.sh | tail -n 1)

rm -rf dist
mkdir -p dist
# The build fetches its pinned setuptools into a fresh environment twice (the sdist, then the wheel
# from it); a transfer the package registry breaks off mid-way fails it, so a failed build is tried
# once more (a real build error fails both times).
if ! "$PYTHON" -m build --outdir dist . >/dev/null; then
    echo "dist: the build failed; trying once more" >&2
    rm -rf dist && mkdir -p dist
    "$PYTHON" -m build --outdir dist . >/dev/null
fi
"$HELM" package charts/drain-router --destination dist >/dev/null
"$HELM" package charts/drain-router-controller --destination dist >/dev/null
if [ "${DIST_IMAGE:-0}" = 1 ]; then
    IMAGE="localhost/drain-router:$VERSION" bash scripts/build-image.sh
    buildah push "localhost/drain-router:$VERSION" "oci-archive:dist/drain-router-$VERSION.oci.tar:drain-router:$VERSION"
fi
ls -1 dist
