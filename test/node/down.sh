#!/usr/bin/env bash
# Tears down what test/node/up.sh brought up, in order: pods (so kubelet
# unmounts their volumes and containerd's CNI removes their netns), kubelet,
# containerd's remaining tasks and containerd, the control plane; then any
# mount left under NODE_DIR, the bridge, the DNAT rules, the directory.
set -uo pipefail
W=${NODE_DIR:-/tmp/modelcache-node}
K8S=${K8S_BIN:-"$(go env GOPATH)/k8s-control-plane"}
[ -d "$W" ] || exit 0
K="$K8S/kubectl --kubeconfig $W/kubeconfig --request-timeout 5s"
stop() { # name: SIGTERM its process group, then SIGKILL after 10 s
  local f="$W/$1.pid"
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL -- "-$pid" 2>/dev/null
  rm -f "$f"
}
if [ -f "$W/kube-apiserver.pid" ] && [ -f "$W/kubelet.pid" ]; then
  # Consumers first, while the daemon still serves CSI unpublishes (their
  # mounts and holds go the product's way), then the daemon.
  $K delete deployments,pods -A --field-selector metadata.namespace!=modelcache-system --wait=false >/dev/null 2>&1
  for _ in $(seq 60); do
    n=$($K get pods -A --field-selector metadata.namespace!=modelcache-system --no-headers 2>/dev/null | wc -l)
    [ "$n" = 0 ] && break; sleep 0.5
  done
  $K delete daemonsets,deployments,pods --all -A --wait=false >/dev/null 2>&1
  for _ in $(seq 60); do
    n=$($K get pods -A --no-headers 2>/dev/null | wc -l)
    [ "$n" = 0 ] && break; sleep 0.5
  done
fi
stop kubelet
if [ -S "$W/containerd.sock" ]; then
  C="ctr --address $W/containerd.sock -n k8s.io"
  for t in $($C tasks ls -q 2>/dev/null); do $C tasks kill -s KILL "$t" >/dev/null 2>&1; done
  sleep 1
  for t in $($C tasks ls -q 2>/dev/null); do $C tasks delete -f "$t" >/dev/null 2>&1; done
  command -v crictl >/dev/null && crictl -r "unix://$W/containerd.sock" rmp -fa >/dev/null 2>&1
fi
stop containerd
# containerd-shims are started in their own sessions: end the ones of this root.
for p in $(pgrep -f "containerd-shim.*-address $W/containerd.sock" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver
stop etcd
# Mounts (kubelet's volumes, containerd's rootfs and shm), deepest first.
awk -v w="$W" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
# Network namespaces the CNI made for this node's pods.
for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do
  grep -qx "$ns" "$W/netns.before" 2>/dev/null || ip netns delete "$ns"
done
ip link delete mcnode0 2>/dev/null
while iptables -t nat -S 2>/dev/null | grep -q 'modelcache-node'; do
  rule=$(iptables -t nat -S | grep 'modelcache-node' | head -1 | sed 's/^-A/-D/')
  eval iptables -t nat $rule || break
done
# kubelet's root: the volumes under it, the shared bind up.sh made, and
# the directory itself when up.sh created it.
awk '$5 ~ "^/var/lib/kubelet/" {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
[ -f "$W/kubelet-bind.ours" ] && umount -l /var/lib/kubelet 2>/dev/null
[ -f "$W/kubelet-root.ours" ] && rm -rf /var/lib/kubelet
rm -rf "$W"
