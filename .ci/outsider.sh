#!/usr/bin/env bash
# Checks the modules the way an outside user meets them once tagged: a
# file-based module proxy serves every module of this tree at the release
# version the adapters require (.ci/modproxy), then
#  1. each published adapter is built and vetted on its own (no go.work, no
#     replace), its dependencies on the core coming from that proxy;
#  2. a fresh module outside the repository `go get`s every adapter and
#     builds and runs a small program on them (.ci/outsider/main.go.txt).
# Nothing in the tree is changed: both run in temporary copies.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
version=$(sed -n 's#^\tgithub.com/sluicekit/sluice v\(.*\)$#v\1#p' goredis/go.mod)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
(cd .ci/modproxy && GOWORK=off go run . -root "$top" -version "$version" -out "$scratch/proxy")
# The machine's module cache may hold an earlier snapshot of this tree at
# the same version (from .ci/tidy or an earlier run), which Go would use
# instead of the proxy's: drop it, and only it.
cache=$(go env GOMODCACHE)
chmod -R u+w "$cache/github.com/sluicekit" 2>/dev/null || true
rm -rf "$cache/github.com/sluicekit" "$cache/cache/download/github.com/sluicekit"
# Go also keeps an index of each module cache directory's files in GOCACHE,
# keyed by path@version and never checked against the files: an earlier
# snapshot's index hides files added since (seen: lua/embedded.go, "undefined:
# scripts"). goindex=0 makes the go command read the directories themselves.
export GODEBUG=goindex=0
export GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=github.com/sluicekit/sluice
export GOPROXY="file://$scratch/proxy,$(go env GOPROXY)"

for m in goredis otel grpc envoy; do
  echo "adapter $m@$version on its own"
  mkdir -p "$scratch/own" && cp -r "$m" "$scratch/own/$m"
  grep -q '^replace' "$scratch/own/$m/go.mod" && { echo "$m/go.mod has a replace directive"; exit 1; }
  (cd "$scratch/own/$m" && go build ./... && go vet ./...)
done

echo "an outside module: go get every adapter at $version, build, run"
mkdir "$scratch/outsider" && cd "$scratch/outsider"
go mod init example.com/outsider >/dev/null 2>&1
cp "$top/.ci/outsider/main.go.txt" main.go
go get github.com/sluicekit/sluice@"$version" github.com/sluicekit/sluice/goredis@"$version" \
  github.com/sluicekit/sluice/otel@"$version" github.com/sluicekit/sluice/grpc@"$version" \
  github.com/sluicekit/sluice/envoy@"$version" >/dev/null
go mod tidy >/dev/null
go run .
