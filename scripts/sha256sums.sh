#!/usr/bin/env bash
# A release's checksum file: DIR/SHA256SUMS, one line per file of DIR in the format `sha256sum`
# writes and checks (`<sha256 hex>  <file name>`, names relative to DIR).
#
#   scripts/sha256sums.sh write DIR    list every file of DIR but SHA256SUMS itself (run it last:
#                                      scripts/dist.sh does, after INSTALL.txt)
#   scripts/sha256sums.sh verify DIR   `sha256sum --check --strict` from inside DIR (a changed or
#                                      missing file fails), and fail if a file of DIR is not listed
#
# make dist writes dist/SHA256SUMS, make dist-check verifies it; a user checks a download the same
# way (docs/install.md, "Checking a download").
set -euo pipefail
shopt -s nullglob dotglob

usage() { echo "usage: $0 write|verify DIR" >&2; exit 2; }
fail() { echo "sha256sums: $*" >&2; exit 1; }

[ $# -eq 2 ] || usage
action=$1 dir=$2
[ -d "$dir" ] || fail "$dir is not a directory"
cd "$dir"

# Every file of DIR the checksum file must cover.
artifacts=()
for f in *; do
    [ "$f" = SHA256SUMS ] && continue
    [ -f "$f" ] || fail "$dir/$f is not a regular file"
    artifacts+=("$f")
done

case $action in
write)
    [ ${#artifacts[@]} -gt 0 ] || fail "$dir holds no file to list"
    sha256sum -- "${artifacts[@]}" > SHA256SUMS
    echo "sha256sums: $dir/SHA256SUMS lists ${#artifacts[@]} files"
    ;;
verify)
    [ -f SHA256SUMS ] || fail "no $dir/SHA256SUMS"
    sha256sum --check --strict --quiet SHA256SUMS || fail "a file of $dir does not match $dir/SHA256SUMS"
    listed=$(sed -E 's/^[0-9a-f]{64} [ *]//' SHA256SUMS)
    for f in "${artifacts[@]}"; do
        grep -qxF -- "$f" <<<"$listed" || fail "$dir/SHA256SUMS does not list $f"
    done
    echo "sha256sums: the ${#artifacts[@]} files of $dir match $dir/SHA256SUMS"
    ;;
*) usage ;;
esac
