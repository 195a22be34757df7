package csi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// mountInfo is one line of /proc/self/mountinfo: the filesystem's device
// (major:minor), the directory of that filesystem the mount shows (its
// root), and where it is mounted.
type mountInfo struct{ dev, root, point string }

func readMountinfo() ([]mountInfo, error) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(raw)
}

func parseMountinfo(raw []byte) ([]mountInfo, error) {
	var out []mountInfo
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 {
			out = append(out, mountInfo{dev: f[2], root: unescapeMountinfo(f[3]), point: unescapeMountinfo(f[4])})
		}
	}
	return out, sc.Err()
}

// Bind is a mount under kubelet's pods directory that shows a directory
// of the store (FindBinds).
type Bind struct {
	// Rel is the directory the mount shows, relative to the store root
	// ("models/llama/<revision>").
	Rel string
	// Volume is what kubelet says of the mount: Target, and from
	// vol_data.json beside it and the path, the volume ID and pod UID.
	Volume Volume
}

// FindBinds lists the mounts under podsDir that show a directory under
// root: same filesystem (device) as root, and a mount root under root's
// path within that filesystem (which holds in any mount namespace, so a
// DaemonSet pod sees the host's mounts the same way). It is how the
// daemon finds the volumes it published when its records of them are
// lost. Mounts of deleted directories and of other drivers (vol_data.json
// names another) are left out.
func FindBinds(podsDir, root string) ([]Bind, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	realPods, err := filepath.EvalSymlinks(podsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return findBinds(mounts, realPods, realRoot), nil
}

func findBinds(mounts []mountInfo, pods, root string) []Bind {
	// The mount root lies on: the last mount (the one on top) at the
	// longest mount point that contains it.
	var on *mountInfo
	for i := range mounts {
		m := &mounts[i]
		if m.point == root || m.point == "/" || strings.HasPrefix(root, m.point+"/") {
			if on == nil || len(m.point) >= len(on.point) {
				on = m
			}
		}
	}
	if on == nil {
		return nil
	}
	rel, _ := filepath.Rel(on.point, root)
	fsRoot := filepath.Join(on.root, rel) // root's path within its filesystem
	var out []Bind
	for _, m := range mounts {
		if m.dev != on.dev || !under(pods, m.point) || strings.HasSuffix(m.root, "//deleted") {
			continue
		}
		r, err := filepath.Rel(fsRoot, m.root)
		if err != nil || r == "." || r == ".." || strings.HasPrefix(r, "../") {
			continue
		}
		v, ok := kubeletVolume(pods, m.point)
		if !ok {
			continue
		}
		out = append(out, Bind{Rel: r, Volume: v})
	}
	return out
}

// kubeletVolume reads what kubelet recorded of the volume mounted at
// target: <pods>/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount, with
// vol_data.json beside it naming the driver and the volume handle. Without
// vol_data.json the handle is kubelet's for an inline volume
// ("csi-" + sha256(pod uid + volume name)). ok is false when vol_data.json
// names another driver.
func kubeletVolume(pods, target string) (Volume, bool) {
	v := Volume{Target: target, ID: "target:" + target}
	rel, _ := filepath.Rel(pods, target)
	parts := strings.Split(rel, "/")
	if len(parts) == 5 && parts[1] == "volumes" && parts[2] == "kubernetes.io~csi" && parts[4] == "mount" {
		v.PodUID = parts[0]
		v.ID = fmt.Sprintf("csi-%x", sha256.Sum256([]byte(parts[0]+parts[3])))
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(target), "vol_data.json"))
	if err != nil {
		return v, true
	}
	var data struct {
		Driver string `json:"driverName"`
		Handle string `json:"volumeHandle"`
	}
	if json.Unmarshal(raw, &data) != nil {
		return v, true
	}
	if data.Driver != "" && data.Driver != DriverName {
		return v, false
	}
	if data.Handle != "" {
		v.ID = data.Handle
	}
	return v, true
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			ok := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					ok = false
					break
				}
				c = c*8 + byte(d-'0')
			}
			if ok {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
