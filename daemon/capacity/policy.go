// Package capacity decides what modelcached may keep on a finite disk, in
// the manner of kubelet's image garbage collection: a byte quota and/or
// high/low watermarks of the filesystem, eviction of the least recently
// used artifact versions down to the low mark (never pinned, never in use,
// never younger than a minimum age), pruning of old revisions, the room
// and the evictable space a pull is admitted against, and the scan of
// /proc that tells which artifacts are in use. Admission itself, with the
// reservations of pulls in flight, is the daemon's (daemon/admission.go):
// it asks this package how much room there is and what could be freed.
//
// Where each concern lives:
//
//	policy.go    Policy (quota, watermarks, minimum age, revisions kept), its
//	             validation, Assess (the pressure now), Room, ParseBytes
//	plan.go      pure plans over one snapshot (Inputs): which versions may go
//	             and in what order (PlanSpace, PlanRevisions), Evictable, Takers
//	evictor.go   Evictor: one eviction pass that reads the store and the
//	             filesystem, plans, evicts and reports
//	procscan.go  Scanner: the processes that hold files of the store open or
//	             mapped, read from /proc
//
// Everything that depends on time or the filesystem takes a clock or a
// stats provider, so the policy is tested without sleeping or filling disks.
package capacity

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Policy is the validated capacity policy.
type Policy struct {
	// QuotaBytes caps the bytes of blobs in the store; 0 means no quota.
	// Over it, eviction frees down to QuotaBytes × LowPercent/HighPercent.
	QuotaBytes int64 `json:"quota,omitempty"`
	// HighPercent and LowPercent are filesystem-use watermarks: above High,
	// eviction frees down to Low. 0/0 disables them (then QuotaBytes must be set
	// for any eviction to happen). Defaults 85/80, as kubelet's image GC.
	HighPercent int `json:"highWatermarkPercent"`
	LowPercent  int `json:"lowWatermarkPercent"`
	// MinAge protects a version younger than this from eviction; default 2m.
	MinAge time.Duration `json:"minAge"`
	// KeepRevisions is how many old (non-current) revisions of a model stay
	// once nothing uses them; default 0: an old revision goes as soon as it
	// is unused and older than MinAge.
	KeepRevisions int `json:"keepRevisions"`
}

// DefaultPolicy is what a node gets without configuration.
func DefaultPolicy() Policy {
	return Policy{HighPercent: 85, LowPercent: 80, MinAge: 2 * time.Minute}
}

// Validate says everything that is wrong with the policy at once.
func (p Policy) Validate() error {
	var errs []error
	if p.QuotaBytes < 0 {
		errs = append(errs, fmt.Errorf("quota %d: want >= 0 bytes (0 = none)", p.QuotaBytes))
	}
	if p.HighPercent < 0 || p.HighPercent > 100 || p.LowPercent < 0 || p.LowPercent > 100 {
		errs = append(errs, fmt.Errorf("watermarks %d/%d: want percents in 0..100", p.HighPercent, p.LowPercent))
	} else if p.HighPercent > 0 && p.LowPercent >= p.HighPercent {
		errs = append(errs, fmt.Errorf("low watermark %d%% must be below the high watermark %d%% (kubelet's defaults are 80/85)", p.LowPercent, p.HighPercent))
	} else if p.HighPercent == 0 && p.LowPercent != 0 {
		errs = append(errs, fmt.Errorf("low watermark %d%% without a high watermark; set both, or both to 0 to disable", p.LowPercent))
	}
	if p.MinAge < 0 {
		errs = append(errs, fmt.Errorf("min age %s: want >= 0", p.MinAge))
	}
	if p.KeepRevisions < 0 {
		errs = append(errs, fmt.Errorf("keep revisions %d: want >= 0", p.KeepRevisions))
	}
	return errors.Join(errs...)
}

// quotaLow is where eviction under a quota stops.
func (p Policy) quotaLow() int64 {
	if p.HighPercent > 0 {
		return int64(float64(p.QuotaBytes) * float64(p.LowPercent) / float64(p.HighPercent))
	}
	return int64(float64(p.QuotaBytes) * 0.95)
}

// Pressure is the disk state the policy sees.
type Pressure struct {
	StoreBytes int64 `json:"storeBytes"`
	Capacity   int64 `json:"fsCapacityBytes"`
	Free       int64 `json:"fsFreeBytes"`
	OverQuota  bool  `json:"overQuota"`
	AboveHigh  bool  `json:"aboveHighWatermark"`
	// Need is how many bytes eviction must free to get back under the low
	// mark (and the quota's low point); 0 when there is no pressure.
	Need int64 `json:"needBytes"`
}

// Assess compares store and filesystem use with the policy.
func (p Policy) Assess(storeBytes, capacity, free int64) Pressure {
	pr := Pressure{StoreBytes: storeBytes, Capacity: capacity, Free: free}
	if p.QuotaBytes > 0 && storeBytes > p.QuotaBytes {
		pr.OverQuota = true
		pr.Need = storeBytes - p.quotaLow()
	}
	if p.HighPercent > 0 && capacity > 0 {
		used := capacity - free
		if used*100 > capacity*int64(p.HighPercent) {
			pr.AboveHigh = true
			if n := used - capacity/100*int64(p.LowPercent); n > pr.Need {
				pr.Need = n
			}
		}
	}
	return pr
}

// Room is how many more bytes may be written before the policy is
// violated: free space above the high mark, and quota headroom.
func (p Policy) Room(storeBytes, capacity, free int64) int64 {
	room := free
	if p.HighPercent > 0 && capacity > 0 {
		room = free - capacity/100*int64(100-p.HighPercent)
	}
	if p.QuotaBytes > 0 {
		room = min(room, p.QuotaBytes-storeBytes)
	}
	return max(room, 0)
}

// ParseBytes reads a size: a plain number of bytes, or a number with a
// unit: K, M, G, T, P (powers of 1000) or Ki, Mi, Gi, Ti, Pi (powers of
// 1024), as Kubernetes quantities are written. An optional trailing "B" is
// accepted ("500GiB").
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "B")
	units := []struct {
		suf string
		mul int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
		{"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}}
	mul := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suf) {
			t, mul = strings.TrimSuffix(t, u.suf), u.mul
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*float64(mul) > 1<<62 {
		return 0, fmt.Errorf("size %q: want bytes or a number with a unit such as 500Gi or 2T", s)
	}
	return int64(f * float64(mul)), nil
}
