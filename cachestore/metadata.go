package cachestore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Metadata is what a model's own files say of it, read once at commit.
// It is best effort: a file that cannot be read is named in Problems and
// never fails a commit.
type Metadata struct {
	Architectures         []string         `json:"architectures,omitempty"`
	ModelType             string           `json:"modelType,omitempty"`
	TorchDtype            string           `json:"torchDtype,omitempty"`
	MaxPositionEmbeddings int64            `json:"maxPositionEmbeddings,omitempty"`
	QuantizationConfig    json.RawMessage  `json:"quantizationConfig,omitempty"`
	Parameters            int64            `json:"parameters,omitempty"`        // from safetensors headers, exact
	ParametersByDtype     map[string]int64 `json:"parametersByDtype,omitempty"` // e.g. BF16 → count
	TensorBytes           int64            `json:"tensorBytes,omitempty"`
	SafetensorsFiles      int              `json:"safetensorsFiles,omitempty"`
	Problems              []string         `json:"problems,omitempty"`
}

const (
	maxConfigBytes      = 4 << 20
	maxSafetensorHeader = 100 << 20 // the format's own limit
)

// readMetadata reads config.json and the safetensors headers (8 bytes of
// length and the JSON header, never the tensors). nil when the manifest
// holds neither. The blobs are read from blobs.
func readMetadata(blobs Provider, m Manifest) *Metadata {
	md := &Metadata{}
	found := false
	for _, e := range m {
		switch {
		case e.Path == "config.json":
			found = true
			if err := readConfig(blobs, e, md); err != nil {
				md.Problems = append(md.Problems, "config.json: "+err.Error())
			}
		case strings.HasSuffix(e.Path, ".safetensors"):
			found = true
			if err := readSafetensors(blobs, e, md); err != nil {
				md.Problems = append(md.Problems, e.Path+": "+err.Error())
			}
		}
	}
	if !found {
		return nil
	}
	return md
}

func readConfig(blobs Provider, e Entry, md *Metadata) error {
	if e.Size > maxConfigBytes {
		return fmt.Errorf("larger than %d bytes", maxConfigBytes)
	}
	f, err := blobs.OpenBlob(e.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	var c struct {
		Architectures         []string        `json:"architectures"`
		ModelType             string          `json:"model_type"`
		TorchDtype            string          `json:"torch_dtype"`
		MaxPositionEmbeddings int64           `json:"max_position_embeddings"`
		QuantizationConfig    json.RawMessage `json:"quantization_config"`
	}
	if err := json.NewDecoder(io.LimitReader(f, maxConfigBytes)).Decode(&c); err != nil {
		return err
	}
	md.Architectures, md.ModelType, md.TorchDtype, md.MaxPositionEmbeddings = c.Architectures, c.ModelType, c.TorchDtype, c.MaxPositionEmbeddings
	if len(c.QuantizationConfig) > 0 && len(c.QuantizationConfig) < 64<<10 && string(c.QuantizationConfig) != "null" {
		md.QuantizationConfig = c.QuantizationConfig
	}
	return nil
}

func readSafetensors(blobs Provider, e Entry, md *Metadata) error {
	f, err := blobs.OpenBlob(e.Digest)
	if err != nil {
		return err
	}
	defer f.Close()
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return fmt.Errorf("header length: %w", err)
	}
	if n > maxSafetensorHeader || int64(n) > e.Size-8 {
		return fmt.Errorf("header length %d is not plausible for a %d-byte file", n, e.Size)
	}
	var hdr map[string]json.RawMessage
	if err := json.NewDecoder(io.LimitReader(f, int64(n))).Decode(&hdr); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	if md.ParametersByDtype == nil {
		md.ParametersByDtype = map[string]int64{}
	}
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			Dtype       string   `json:"dtype"`
			Shape       []int64  `json:"shape"`
			DataOffsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return fmt.Errorf("tensor %s: %w", name, err)
		}
		count := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %s: negative dimension", name)
			}
			count *= d
		}
		md.Parameters += count
		md.ParametersByDtype[t.Dtype] += count
		md.TensorBytes += t.DataOffsets[1] - t.DataOffsets[0]
	}
	md.SafetensorsFiles++
	return nil
}
