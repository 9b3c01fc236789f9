#!/bin/sh
# Pin cluster/kube/go.mod to one Kubernetes release. k8s.io/kubernetes points its k8s.io/* staging
# modules at ./staging, which a module that requires it cannot see; so each of them is replaced with
# the published module of the matching version (v1.N.P -> v0.N.P), the list read from that release's
# own go.mod. Run it to move to another release, then commit go.mod and go.sum.
set -eu
VERSION=${1:-v1.37.2}
STAGING_VERSION=v0.${VERSION#v1.}
cd "$(dirname "$0")/kube"
[ -f go.mod ] || go mod init drain-router.dev/cluster/kube
release_gomod=$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
for module in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$release_gomod"); do
	go mod edit -replace="$module=$module@$STAGING_VERSION"
done
go mod edit -require="k8s.io/kubernetes@$VERSION"
go mod edit -go=1.26.0
go mod tidy
