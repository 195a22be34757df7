package daemon

import (
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/daemon/capacity"
)

// FileConfig is the YAML config file (--config). Every field is optional;
// flags given on the command line override it.
//
//	quota: 500Gi                 # byte quota of the store; 0 or absent: none
//	highWatermarkPercent: 85     # filesystem use that starts eviction
//	lowWatermarkPercent: 80      # where eviction stops
//	minAge: 2m                   # younger versions are never evicted
//	keepRevisions: 0             # old revisions kept once unused
//	maxConcurrentPulls: 2
//	bandwidthLimit: 100M         # bytes per second over all pulls
//	progressFloor: 1Mi           # a download slower than this per progressWindow is retried
//	progressWindow: 1m
//	fileRoots: [/srv/models]     # the only directories file:// may read
//	kernelCacheSignaturePolicy: required   # or off; the floor of socket pulls
//	maxConnectionsPerUID: 64     # API socket connections one local user may hold; 0: no limit
type FileConfig struct {
	Quota              string `json:"quota,omitempty"`
	HighPercent        *int   `json:"highWatermarkPercent,omitempty"`
	LowPercent         *int   `json:"lowWatermarkPercent,omitempty"`
	MinAge             string `json:"minAge,omitempty"`
	KeepRevisions      *int   `json:"keepRevisions,omitempty"`
	MaxConcurrentPulls *int   `json:"maxConcurrentPulls,omitempty"`
	BandwidthLimit     string `json:"bandwidthLimit,omitempty"`
	ProgressFloor      string `json:"progressFloor,omitempty"`
	ProgressWindow     string `json:"progressWindow,omitempty"`

	FileRoots                  []string `json:"fileRoots,omitempty"`
	KernelCacheSignaturePolicy string   `json:"kernelCacheSignaturePolicy,omitempty"`
	MaxConnectionsPerUID       *int     `json:"maxConnectionsPerUID,omitempty"`
}

// LoadConfigFile applies the file at path to cfg. Unknown keys and bad
// values are errors that name the file and the key.
func LoadConfigFile(path string, cfg *Config) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	var fc FileConfig
	if err := yaml.UnmarshalStrict(raw, &fc); err != nil {
		return fmt.Errorf("--config %s: %v", path, err)
	}
	if fc.Quota != "" {
		n, err := capacity.ParseBytes(fc.Quota)
		if err != nil {
			return fmt.Errorf("--config %s: quota: %v", path, err)
		}
		cfg.Capacity.QuotaBytes = n
	}
	if fc.BandwidthLimit != "" {
		n, err := capacity.ParseBytes(fc.BandwidthLimit)
		if err != nil {
			return fmt.Errorf("--config %s: bandwidthLimit: %v", path, err)
		}
		cfg.BandwidthLimit = n
	}
	if fc.ProgressFloor != "" {
		n, err := capacity.ParseBytes(fc.ProgressFloor)
		if err != nil {
			return fmt.Errorf("--config %s: progressFloor: %v", path, err)
		}
		cfg.ProgressFloor = n
	}
	if fc.ProgressWindow != "" {
		d, err := time.ParseDuration(fc.ProgressWindow)
		if err != nil {
			return fmt.Errorf("--config %s: progressWindow %q: want a duration such as 1m", path, fc.ProgressWindow)
		}
		cfg.ProgressWindow = d
	}
	if fc.MinAge != "" {
		d, err := time.ParseDuration(fc.MinAge)
		if err != nil {
			return fmt.Errorf("--config %s: minAge %q: want a duration such as 2m", path, fc.MinAge)
		}
		cfg.Capacity.MinAge = d
	}
	if fc.FileRoots != nil {
		cfg.FileRoots = fc.FileRoots
	}
	if fc.KernelCacheSignaturePolicy != "" {
		cfg.KernelCacheSignaturePolicy = fc.KernelCacheSignaturePolicy
	}
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&cfg.Capacity.HighPercent, fc.HighPercent)
	set(&cfg.Capacity.LowPercent, fc.LowPercent)
	set(&cfg.Capacity.KeepRevisions, fc.KeepRevisions)
	set(&cfg.MaxConcurrentPulls, fc.MaxConcurrentPulls)
	set(&cfg.MaxConnectionsPerUID, fc.MaxConnectionsPerUID)
	return nil
}
