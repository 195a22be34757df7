package capacity

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/api"
)

// Scanner finds processes that hold files under the store root open or
// mapped (safetensors are mmapped), by reading /proc/<pid>/fd and
// /proc/<pid>/maps. It needs the right to read other processes' /proc
// entries (root, or CAP_SYS_PTRACE); entries it may not read are counted,
// not fatal.
type Scanner struct {
	Root string // absolute store root
	Proc string // "/proc" unless a test says otherwise
	Self int    // a pid to ignore (the daemon itself)
}

// Use is one process's hold on one path under the root.
type Use struct {
	Rel    string // path relative to the root
	Holder api.Holder
}

// ScanStats says what a scan read.
type ScanStats struct {
	Processes  int `json:"processes"`
	Unreadable int `json:"unreadable"`
	Uses       int `json:"uses"`
}

// Scan lists the uses of files under the root, one per (process, path).
func (s *Scanner) Scan() ([]Use, ScanStats, error) {
	proc := s.Proc
	if proc == "" {
		proc = "/proc"
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, ScanStats{}, err
	}
	prefix := filepath.Clean(s.Root) + "/"
	var st ScanStats
	var out []Use
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == s.Self {
			continue
		}
		st.Processes++
		seen := map[string]bool{}
		var who string
		add := func(p string) {
			p = strings.TrimSuffix(p, " (deleted)")
			if !strings.HasPrefix(p, prefix) || seen[p] {
				return
			}
			seen[p] = true
			if who == "" {
				comm, _ := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
				who = "pid " + e.Name() + " (" + strings.TrimSpace(string(comm)) + ")"
			}
			out = append(out, Use{Rel: p[len(prefix):], Holder: api.Holder{Kind: "process", ID: who}})
		}
		fdDir := filepath.Join(proc, e.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			st.Unreadable++
			continue
		}
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && target[0] == '/' {
				add(target)
			}
		}
		maps, err := os.ReadFile(filepath.Join(proc, e.Name(), "maps"))
		if err != nil {
			continue
		}
		if !bytes.Contains(maps, []byte(prefix)) {
			continue // cheap: most processes map nothing of ours
		}
		sc := bufio.NewScanner(bytes.NewReader(maps))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			// address perms offset dev inode pathname
			if i := strings.Index(line, prefix); i >= 0 {
				add(line[i:])
			}
		}
	}
	st.Uses = len(out)
	return out, st, nil
}

// VersionOf maps a path relative to the root to the artifact version
// whose tree it is in ("models/<name>/<rev>/…"); ok is false for other
// paths (blobs are mapped through manifests by the caller).
func VersionOf(rel string) (name, rev string, ok bool) {
	parts := strings.SplitN(rel, "/", 4)
	if len(parts) < 3 || (parts[0] != "models" && parts[0] != "kernels") || parts[2] == "current" {
		return "", "", false
	}
	return parts[1], parts[2], true
}

// BlobOf maps "blobs/sha256/<2>/<64>" to its digest.
func BlobOf(rel string) (string, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || parts[0] != "blobs" || parts[1] != "sha256" || len(parts[3]) != 64 {
		return "", false
	}
	return "sha256:" + parts[3], true
}
