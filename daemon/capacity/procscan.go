package capacity

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
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
// Processes are read by up to scanWorkers goroutines at once: the cost is
// system calls and the kernel's formatting of maps, per process, so a
// node's cores divide it (docs/benchmarks.md has the figure at 10,000
// processes).
func (s *Scanner) Scan() ([]Use, ScanStats, error) {
	proc := s.Proc
	if proc == "" {
		proc = "/proc"
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil, ScanStats{}, err
	}
	var pids []string
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != s.Self {
			pids = append(pids, e.Name())
		}
	}
	workers := min(runtime.GOMAXPROCS(0), scanWorkers, max(len(pids)/64, 1))
	type part struct {
		uses []Use
		st   ScanStats
	}
	parts := make([]part, workers)
	var wg sync.WaitGroup
	for w := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Contiguous shares: the parts joined keep /proc's order.
			for _, pid := range pids[w*len(pids)/workers : (w+1)*len(pids)/workers] {
				parts[w].uses = s.scanPid(proc, pid, parts[w].uses, &parts[w].st)
			}
		}()
	}
	wg.Wait()
	var st ScanStats
	var out []Use
	for _, p := range parts {
		out = append(out, p.uses...)
		st.Processes += p.st.Processes
		st.Unreadable += p.st.Unreadable
	}
	st.Uses = len(out)
	return out, st, nil
}

// scanWorkers bounds the goroutines of one scan.
const scanWorkers = 8

// scanPid appends pid's uses of files under the root to out.
func (s *Scanner) scanPid(proc, pid string, out []Use, st *ScanStats) []Use {
	prefix := filepath.Clean(s.Root) + "/"
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
			comm, _ := os.ReadFile(filepath.Join(proc, pid, "comm"))
			who = "pid " + pid + " (" + strings.TrimSpace(string(comm)) + ")"
		}
		out = append(out, Use{Rel: p[len(prefix):], Holder: api.Holder{Kind: "process", ID: who}})
	}
	fdDir := filepath.Join(proc, pid, "fd")
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		st.Unreadable++
		return out
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && target[0] == '/' {
			add(target)
		}
	}
	maps, err := os.ReadFile(filepath.Join(proc, pid, "maps"))
	if err != nil || !bytes.Contains(maps, []byte(prefix)) {
		return out // cheap: most processes map nothing of ours
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
	return out
}

// VersionOf maps a path relative to the root to the artifact version
// whose tree it is in ("models/<name>/<rev>/…", or under private/); ok is
// false for other paths (blobs are mapped through manifests by the
// caller).
func VersionOf(rel string) (name, rev string, ok bool) {
	parts, ok := cachestore.InTrees(rel)
	if !ok || len(parts) < 2 || parts[1] == "current" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// BlobOf maps "blobs/sha256/<2>/<64>" to its digest.
func BlobOf(rel string) (string, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || parts[0] != "blobs" || parts[1] != "sha256" || len(parts[3]) != 64 {
		return "", false
	}
	return "sha256:" + parts[3], true
}
