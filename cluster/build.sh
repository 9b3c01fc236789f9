#!/bin/sh
# Build the test cluster's binaries once and print the directory that holds them: `kube` (API
# server, controller manager, scheduler and kube-proxy of the release pinned in kube/go.mod, linked
# into one binary) and `etcd` (the release pinned in etcd/go.mod). Built outside the work tree, under
# a key made of everything that decides the result, so a second build, or a second checkout, costs
# nothing: DRAIN_ROUTER_CLUSTER_CACHE (default ~/.cache/drain-router/cluster).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cache=${DRAIN_ROUTER_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/drain-router/cluster}
key=$( (go version; cat "$here/build.sh" "$here"/kube/go.mod "$here"/kube/go.sum "$here"/kube/*.go \
	"$here"/etcd/go.mod "$here"/etcd/go.sum "$here"/etcd/*.go) | sha256sum | cut -c1-16)
out=$cache/$key
if [ -x "$out/kube" ] && [ -x "$out/etcd" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$out"
# The release's version, stamped as its own build does: a module build otherwise reports
# v0.0.0-master, which charts' kubeVersion constraints refuse.
version=$(sed -n 's#^[[:space:]]*k8s\.io/kubernetes \(v[0-9.]*\)$#\1#p;s#^require k8s\.io/kubernetes \(v[0-9.]*\)$#\1#p' \
	"$here/kube/go.mod" | head -n1)
minor=$(echo "$version" | cut -d. -f2)
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
ldflags="$ldflags -X $pkg.buildDate=1970-01-01T00:00:00Z"
(cd "$here/kube" && go build -trimpath -ldflags "$ldflags" -o "$out/kube.tmp" .) >&2
mv "$out/kube.tmp" "$out/kube"
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" .) >&2
mv "$out/etcd.tmp" "$out/etcd"
echo "$out"
