// Package kernels decides GPU kernel caches for this node: the GPU
// inventory (NVML or a simulated one), a kernel cache image's signature
// under the node's policy, its compatibility with the GPUs, and which
// Ready caches serve a model (modelctl env, CSI volumes with
// kernelCaches: auto). The daemon's pull calls it before and after an
// image's layers are fetched; the package links nothing of the daemon.
//
// Where to find what, by file:
//
//	kernels.go  Set and Config: the inventory, compatibility, signature checks,
//	            a cache's manifest; the MCV cache directories (Dirs)
//	policy.go   the signature policy a desire is checked under (the node's floor)
//	env.go      what a version recorded, env, the caches that serve a model,
//	            the socket API's views of the inventory and of a report
package kernels
