#!/usr/bin/env bash
# Builds kube-apiserver v1.34.4 and etcd v3.6.4 from the Go module proxy
# (no release downloads: this machine reaches only the proxy) into DEST
# (default $(go env GOPATH)/k8s-control-plane), where the Kubernetes tests
# find them through KUBEBUILDER_ASSETS. About 3.5 minutes cold on 2 cores.
# The real-node test (test/node) also needs kubelet, kube-scheduler,
# kube-controller-manager and kubectl of the same version: about 2.5 minutes
# more. Nothing to do when every binary is there.
set -euo pipefail
K8S=v1.34.4
DEST=${1:-"$(go env GOPATH)/k8s-control-plane"}
CMDS="kube-apiserver kubelet kube-scheduler kube-controller-manager kubectl"
missing=()
for b in etcd $CMDS; do
  [ -x "$DEST/$b" ] || missing+=("$b")
done
[ "${#missing[@]}" -eq 0 ] && exit 0
mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
go mod init k8sbuild >/dev/null 2>&1
go mod download -json "k8s.io/kubernetes@$K8S" >/dev/null
gomod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S.mod"
# kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging/…; outside its tree each must point at its published v0.x.
staging=$(grep -oE '^\s*k8s\.io/[A-Za-z0-9._-]+ => \./staging' "$gomod" | awk '{print $1}')
args=()
for m in $staging; do
  args+=("-replace=$m=$m@v0${K8S#v1}")
done
go mod edit -require="k8s.io/kubernetes@$K8S" "${args[@]}"
etcd=$(grep -E '^\s*go\.etcd\.io/etcd/server/v3 ' "$gomod" | awk '{print $2}')
cat > etcd.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
pkgs=()
for b in $CMDS; do
  pkgs+=("k8s.io/kubernetes/cmd/$b@$K8S")
done
go get "go.etcd.io/etcd/server/v3@$etcd" "${pkgs[@]}"
[ -x "$DEST/etcd" ] || go build -o "$DEST/etcd" .
for b in "${missing[@]}"; do
  [ "$b" = etcd ] && continue
  go build -ldflags "-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34" \
    -o "$DEST/$b" "k8s.io/kubernetes/cmd/$b"
  if [ "$b" = kubectl ]; then "$DEST/$b" version --client; else "$DEST/$b" --version; fi
done
# sed, not head: head exits after one line, and under pipefail the
# SIGPIPE etcd may then get fails the script (exit 141).
"$DEST/etcd" --version | sed -n 1p
