package warm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// DefaultShare is the share of MemAvailable a warm may fill when no
// other is set: a quarter, so that warming never pushes out much of what
// the node's processes and other models hold.
const DefaultShare = 0.25

// MemAvailable reads MemAvailable from /proc/meminfo, in bytes: the
// kernel's estimate of memory available to start new work without
// swapping (free memory plus the page cache and slabs it can reclaim).
func MemAvailable() (int64, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("warm: %w", err)
	}
	return parseMemAvailable(raw)
}

func parseMemAvailable(raw []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("MemAvailable:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			break
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 || kb > (1<<53)/1024 {
			break
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("warm: /proc/meminfo has no MemAvailable line in kB (Linux 3.14 or newer reports it)")
}

// Budget is the bytes a warm of a model of model bytes may read into the
// page cache: share of available (MemAvailable), never more than the
// model. share must be in (0, 1].
func Budget(share float64, available, model int64) (int64, error) {
	if err := checkShare(share); err != nil {
		return 0, err
	}
	return max(0, min(int64(share*float64(available)), model)), nil
}

func checkShare(share float64) error {
	if !(share > 0 && share <= 1) {
		return fmt.Errorf("warm: a share of MemAvailable of %v: give one in (0, 1], e.g. %v", share, DefaultShare)
	}
	return nil
}
