package gpu

import "testing"

// FuzzParseManifest: a kernel cache manifest never panics the parser, and
// every target it accepts is complete (backend, arch, warp size), so the
// per-GPU check has something to compare.
func FuzzParseManifest(f *testing.F) {
	for _, s := range []string{sm90Manifest, sm80Manifest, `{"vllm":[{"triton_cache_entries":[{"target":{"backend":"cuda","arch":90,"warp_size":32}}]}]}`,
		`{"targets":[{"backend":"rocm","arch":"gfx90a","warp_size":64}]}`, `[{"arch":1e999}]`, `{"triton":[{"arch":{"x":1}}]}`, `null`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) ([]Target, error){ParseManifest, func(b []byte) ([]Target, error) { return ParseSummary(string(b)) }} {
			ts, err := parse(b)
			if err != nil {
				continue
			}
			for _, x := range ts {
				if x.Backend == "" || x.Arch == "" || x.WarpSize <= 0 {
					t.Fatalf("accepted an incomplete target %+v from %q", x, b)
				}
			}
			Check(Inventory{Devices: []Device{{Backend: "cuda", Arch: "90", WarpSize: 32}}, CUDADriverVersion: "12.4"}, ts)
		}
	})
}
