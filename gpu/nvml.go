//go:build cgo && linux

package gpu

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// detectNVML loads libnvidia-ml.so.1 (dlopen at run time), reads the
// driver and every device, and shuts NVML down again.
func detectNVML() (inv Inventory) {
	inv = Inventory{Source: SourceNone, Devices: []Device{}}
	defer func() {
		// NVML is C code behind dlopen; a broken driver install must not
		// take the daemon down.
		if r := recover(); r != nil {
			inv = Inventory{Source: SourceNone, Devices: []Device{}, Reason: fmt.Sprintf("NVML panicked: %v", r)}
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			inv.Reason = "no NVIDIA driver: libnvidia-ml.so.1 not found (install the driver, or on Kubernetes run the pod with the NVIDIA runtime class)"
		} else {
			inv.Reason = "NVML init: " + nvml.ErrorString(ret)
		}
		return inv
	}
	defer nvml.Shutdown()
	inv.Source = SourceNVML
	if v, ret := nvml.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		inv.DriverVersion = v
	}
	if v, ret := nvml.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDADriverVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		inv.Reason = "NVML device count: " + nvml.ErrorString(ret)
		return inv
	}
	var problems []string
	for i := 0; i < n; i++ {
		h, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			problems = append(problems, fmt.Sprintf("device %d: %s", i, nvml.ErrorString(ret)))
			continue
		}
		dv := Device{Index: i, Backend: "cuda", WarpSize: 32}
		dv.Name, _ = h.GetName()
		dv.UUID, _ = h.GetUUID()
		if major, minor, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			dv.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
			dv.Arch = fmt.Sprint(major*10 + minor)
			dv.Architecture = Family(major, minor)
		} else {
			problems = append(problems, fmt.Sprintf("device %d: compute capability: %s", i, nvml.ErrorString(ret)))
		}
		if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			dv.MemoryBytes = m.Total
		}
		inv.Devices = append(inv.Devices, dv)
	}
	if len(inv.Devices) == 0 && len(problems) == 0 {
		problems = append(problems, "the driver reports no GPU")
	}
	inv.Reason = strings.Join(problems, "; ")
	return inv
}
