// Package csi is modelcached's CSI node plugin: the Identity and Node
// services of the Container Storage Interface (spec v1) for inline
// ephemeral volumes, driver csi.modelcache.io, and kubelet's plugin
// registration service, so no node-driver-registrar sidecar is needed.
//
// A pod asks for a model by name:
//
//	volumes:
//	- name: model
//	  csi:
//	    driver: csi.modelcache.io
//	    readOnly: true
//	    volumeAttributes:
//	      modelCache: llama-3-8b      # a ModelCache name or a local artifact name
//	      revision: 5f0b02c7…         # optional: one the node holds
//	      kernelCaches: none          # none (the default) or auto
//	      kernelCacheWritable: "1Gi"  # optional: pods may compile into the volume (writable.go); needs readOnly unset
//	      warm: "true"                # "false": the node does not read the model into the page cache ahead of the pod
//
// NodePublishVolume validates the request (target under kubelet's pods
// directory, no ".."; attributes by name), asks the
// Backend for the tree of one exact revision, which the Backend holds from
// then on, and bind-mounts that tree read-only (nosuid, nodev) at the
// target; the bind is read-only before it is attached, so the copies that
// mount propagation makes for kubelet and the pod are read-only too. With
// kernelCaches: auto the tree is one the Backend composes: the model's
// files with its kernel caches compatible with the node under
// kernels/<name>/ (Volume.Kernels names them; they are held too), or the
// model's own tree when there are none. A repeated call for a mounted
// target succeeds without a second mount. A volume ID mounts at one
// target: at another while the first is mounted it is FailedPrecondition;
// a hold whose target's mount went is released and taken afresh. NodeUnpublishVolume unmounts,
// removes the target directory and
// releases the hold; it succeeds for a target already gone.
//
// The target is resolved once per call, beneath a descriptor of the pods
// directory and through no symlink (openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS; a walk with O_NOFOLLOW per directory before Linux
// 5.6): a symlink anywhere below the pods directory is InvalidArgument.
// Everything after works on descriptors: mkdirat and unlinkat on the
// parent's, the mount-point check (the target's mount ID against its
// parent's) and move_mount onto one descriptor of the target, and the
// unmount of exactly the mount a descriptor shows (mount.go says why
// through /proc/self/fd). A directory of the path swapped for a symlink
// during a call therefore cannot move a mount outside the pods directory
// or stack one on a mounted target. Calls for one target path run one
// at a time; calls for different targets run alongside (a Backend.Hold
// that composes a large tree holds up only its own target), sharing only
// the few syscalls from the mount-point check to the mount.
//
// Errors are gRPC status errors kubelet understands: the Backend returns
// Unavailable (kubelet retries; the message is the node's progress) while
// a model downloads, FailedPrecondition when it failed or is incompatible,
// NotFound for a name the node cannot serve, InvalidArgument for a bad
// attribute (naming it). Anything else is Internal. Messages carry no
// '%' (kubelet formats them into its events).
//
// Holds outlive the driver: the Backend records them (the daemon in its
// index). At start, Serve drops the record of any volume whose target is
// no longer a mount point (its pod went while the daemon was down, or the
// node rebooted), handing its writable layer to a LayerKeeper first;
// kubelet publishes again for a pod that still runs.
// When the records are lost (the daemon's index rebuilt from its store),
// FindBinds finds the volumes still mounted from the mount table: mounts
// under the pods directory that show a directory of the store, with the
// volume ID from kubelet's vol_data.json beside each. NodeUnpublishVolume
// releases the holds of its target whatever their volume ID.
//
// Registration: Serve also listens on <RegistrationDir>/csi.modelcache.io-reg.sock,
// where kubelet's plugin watcher finds it, and answers kubelet's
// pluginregistration.v1 GetInfo with the CSI socket's path.
//
// Where to find what:
//
//	server.go     the Backend interface, Config, Driver: New, Serve, the
//	              reconcile at start, the Identity and registration services
//	publish.go    the Node service: NodePublishVolume and
//	              NodeUnpublishVolume, the request's attributes and target
//	mount.go      a target path opened beneath the pods directory, the
//	              descriptor-based mkdir, bind mount, mount check and unmount
//	mountinfo.go  the mount table: FindBinds, the mounts that show the
//	              store, and the volume IDs kubelet recorded beside them
//	writable.go   kernelCacheWritable: the overlay of the held tree and a
//	              volume's bounded tmpfs layer, made at publish, gone at unpublish
//	              once a Backend that keeps layers (LayerKeeper) has copied it
package csi
