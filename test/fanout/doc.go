// Package fanout measures fan-out between nodes (docs/fan-out.md) with
// real processes: N modelcached daemons, each in a network namespace of
// its own with its own root and peer
// port, against a real kube-apiserver (internal/kubetest) and one hub
// origin throttled to a fixed rate, all given one ModelCache at once.
// It needs root (namespaces, a bridge) and iproute2; without them its
// test stops as testenv.Missing says.
//
//   - netns.go: Net, a bridge on a free 10.77.X.0/24 in the root
//     namespace and the namespaces off it (a veth each, the bridge's
//     address as the default route); names carry the pid, so runs never
//     collide and a run removes what a killed one left.
//   - harness.go: Harness, the API server behind a forwarder on the
//     bridge (the daemons' kubeconfig), the service account and its peer
//     token, the throttled origin (hubtest on the bridge, a model in 4
//     shards), and runs: Alone (one daemon, no peer port) and FanOut (N
//     daemons with peer ports), each timed from the ModelCache's creation
//     until every node is Ready, with the bytes the origin sent.
//   - daemon.go: one modelcached process in its namespace: its flags
//     (its own root, socket and models dir; the peer port on its
//     namespace's address), its waits (ended early when it exits or a
//     pull fails) and its stop.
//
// fanout_test.go holds TestFanOutNetns (3 daemons, a small model: all
// Ready, the origin sends the model about once, each status names its
// peer address) and BenchmarkFanOutNetns (make bench; docs/benchmarks.md).
package fanout
