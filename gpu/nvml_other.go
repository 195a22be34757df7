//go:build !cgo || !linux

package gpu

func detectNVML() Inventory {
	return Inventory{Source: SourceNone, Devices: []Device{}, Reason: "built without cgo: NVML cannot be loaded; use --gpu-inventory"}
}
