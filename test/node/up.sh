#!/usr/bin/env bash
# Brings up a one-node Kubernetes on this machine for the real-node test:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (built by
# test/k8s/build-control-plane.sh), containerd, runc and the CNI bridge
# (Debian), kubelet; imports the daemon image (make image) and a pause image.
# Everything lives under NODE_DIR and is undone by test/node/down.sh.
#   test/node/up.sh IMAGE_TAR IMAGE_REF
# Prints nothing on success but "ready"; logs are NODE_DIR/*.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE_TAR=${1:?image archive}
IMAGE_REF=${2:?image ref}
W=${NODE_DIR:-/tmp/modelcache-node}
K8S=${K8S_BIN:-"$(go env GOPATH)/k8s-control-plane"}
NODE=${NODE_NAME:-modelcache-node}
HOSTIP=${HOST_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for(i=1;i<NF;i++) if($i=="src") print $(i+1)}')}
[ -n "$HOSTIP" ] || HOSTIP=$(hostname -I | awk '{print $1}')
APIPORT=16443
mkdir -p "$W"/{etcd,pki,containerd,cni/net.d,kubelet,logs}
# kubelet runs with its standard root dir, /var/lib/kubelet: the bundle's
# CSI driver mounts kubelet's plugin, registry and pods directories at
# their host paths, as on every real node. down.sh removes it when this
# script made it.
KROOT=/var/lib/kubelet
[ -e "$KROOT/pods" ] || touch "$W/kubelet-root.ours"
mkdir -p "$KROOT"/{pods,plugins,plugins_registry}
# CI quirk: / is a private mount here; the CSI driver's Bidirectional
# propagation of the pods directory needs a shared one (systemd makes /
# shared on real nodes). Only the kubelet root is made shared: a bind of
# it onto itself, undone by down.sh.
if ! awk '$5=="/var/lib/kubelet"' /proc/self/mountinfo | grep -q .; then
  mount --bind "$KROOT" "$KROOT" && touch "$W/kubelet-bind.ours"
fi
mount --make-rshared "$KROOT"
echo "$HOSTIP" > "$W/hostip"
ip netns list 2>/dev/null | awk '{print $1}' > "$W/netns.before"

start() { # name cmd…: runs in the background, pid in $W/<name>.pid
  local n=$1; shift
  setsid "$@" >"$W/logs/$n.log" 2>&1 </dev/null &
  echo $! > "$W/$n.pid"
}
wait_for() { # what seconds cmd…
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "up.sh: $what not ready after ${secs}s; see $W/logs" >&2; return 1
}

# --- credentials: one admin token, a service-account key pair ---
[ -f "$W/pki/sa.key" ] || openssl genrsa -out "$W/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$W/pki/sa.key" -pubout -out "$W/pki/sa.pub" 2>/dev/null
TOKEN=$(cat "$W/pki/token" 2>/dev/null || head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' | tee "$W/pki/token")
echo "$TOKEN,admin,admin,system:masters" > "$W/pki/tokens.csv"
# kubectl exec/logs: the API server calls kubelet with a client certificate
# of a CA that kubelet trusts (authentication.x509.clientCAFile below).
if [ ! -f "$W/pki/kubelet-client.crt" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$W/pki/ca.key" -out "$W/pki/ca.crt" -days 2 -subj /CN=modelcache-node-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$W/pki/kubelet-client.key" -out "$W/pki/kubelet-client.csr" -subj "/O=system:masters/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in "$W/pki/kubelet-client.csr" -CA "$W/pki/ca.crt" -CAkey "$W/pki/ca.key" -CAcreateserial -out "$W/pki/kubelet-client.crt" -days 2 2>/dev/null
fi
cat > "$W/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$APIPORT", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: "$TOKEN"}}]
contexts: [{name: local, context: {cluster: local, user: admin}}]
current-context: local
KC

# --- control plane ---
start etcd "$K8S/etcd" --data-dir "$W/etcd" --listen-client-urls http://127.0.0.1:23790 \
  --advertise-client-urls http://127.0.0.1:23790 --listen-peer-urls http://127.0.0.1:23800 \
  --initial-advertise-peer-urls http://127.0.0.1:23800 --initial-cluster default=http://127.0.0.1:23800
wait_for etcd 20 curl -fsS http://127.0.0.1:23790/health
start kube-apiserver "$K8S/kube-apiserver" --etcd-servers http://127.0.0.1:23790 \
  --bind-address 0.0.0.0 --secure-port $APIPORT --advertise-address "$HOSTIP" --cert-dir "$W/pki" \
  --token-auth-file "$W/pki/tokens.csv" --authorization-mode Node,RBAC \
  --service-account-key-file "$W/pki/sa.pub" --service-account-signing-key-file "$W/pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.0.0.0/24 \
  --allow-privileged=true --kubelet-preferred-address-types InternalIP \
  --kubelet-client-certificate "$W/pki/kubelet-client.crt" --kubelet-client-key "$W/pki/kubelet-client.key"
wait_for kube-apiserver 60 "$K8S/kubectl" --kubeconfig "$W/kubeconfig" get --raw /readyz
start kube-controller-manager "$K8S/kube-controller-manager" --kubeconfig "$W/kubeconfig" \
  --authentication-kubeconfig "$W/kubeconfig" --authorization-kubeconfig "$W/kubeconfig" \
  --service-account-private-key-file "$W/pki/sa.key" --root-ca-file "$W/pki/apiserver.crt" \
  --use-service-account-credentials --controllers '*,-nodeipam' --secure-port 0 --leader-elect=false
start kube-scheduler "$K8S/kube-scheduler" --kubeconfig "$W/kubeconfig" \
  --authentication-kubeconfig "$W/kubeconfig" --authorization-kubeconfig "$W/kubeconfig" \
  --secure-port 0 --leader-elect=false

# --- containerd (Debian) with the CNI bridge ---
cat > "$W/cni/net.d/10-bridge.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "modelcache-node", "plugins": [
  {"type": "bridge", "bridge": "mcnode0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
CNI
cat > "$W/containerd.toml" <<CT
version = 2
root = "$W/containerd/root"
state = "$W/containerd/state"
[grpc]
  address = "$W/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:node-test"
  # CI machines run in a container-like VM whose oom_score_adj is already
  # raised: containerd must not try to lower a container's below it.
  restrict_oom_score_adj = true
  # The cgroupfs driver (no systemd as PID 1), like kubelet below.
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  # The bundle asks for runtimeClassName nvidia; here it is plain runc.
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$W/cni/net.d"
CT
start containerd containerd --config "$W/containerd.toml"
wait_for containerd 20 ctr --address "$W/containerd.sock" version
# The sandbox image: registry.k8s.io is out of reach, so a pause built here.
CGO_ENABLED=0 go build -o "$W/pause" ./test/node/pause
go run ./internal/mkimage -out "$W/pause.tar" -ref registry.k8s.io/pause:node-test -entrypoint /usr/bin/pause "$W/pause" >/dev/null
ctr --address "$W/containerd.sock" -n k8s.io images import "$W/pause.tar" >/dev/null
ctr --address "$W/containerd.sock" -n k8s.io images import "$IMAGE_TAR" >/dev/null

# --- kubelet ---
cat > "$W/kubelet.yaml" <<KL
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# CI machines have cgroup v1 only; kubelet 1.34 refuses it unless told.
failCgroupV1: false
# No systemd as PID 1: cgroupfs, as containerd's runc above.
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$W/containerd.sock
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: "$W/pki/ca.crt"}}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
failSwapOn: false
# The disk is shared with other work: do not evict pods for its fill level.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
KL
start kubelet "$K8S/kubelet" --config "$W/kubelet.yaml" --kubeconfig "$W/kubeconfig" \
  --root-dir /var/lib/kubelet --hostname-override "$NODE" --node-ip "$HOSTIP" \
  --node-labels nvidia.com/gpu.present=true
# No kube-proxy: one DNAT rule stands in for it, taking pods to the API
# server through the kubernetes Service's address (in-cluster config).
iptables -t nat -A PREROUTING -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "$HOSTIP:$APIPORT" -m comment --comment modelcache-node
iptables -t nat -A OUTPUT -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "$HOSTIP:$APIPORT" -m comment --comment modelcache-node
K="$K8S/kubectl --kubeconfig $W/kubeconfig"
wait_for "node $NODE" 60 sh -c "$K get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
# The bundle's runtimeClassName: nvidia; here a handler of plain runc.
printf 'apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n' | $K apply -f - >/dev/null
echo ready
