package xettest

import (
	"encoding/json"
	"math/rand"
	"net/http"
)

// TokenHandler answers a hub's xet-read-token route with a fresh token
// (auth.md, "Response Format": accessToken, exp, casUrl).
func (c *CAS) TokenHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.TokensIssued.Add(1)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(c.Token())
	})
}

// Model makes size bytes that look like weights: tensors of tensor bytes,
// each of 4-byte floats around a tensor-specific scale, so that byte
// grouping compresses them somewhat, as with real bf16/fp32 weights.
func Model(seed int64, size, tensor int) []byte {
	b := make([]byte, size)
	rng := rand.New(rand.NewSource(seed))
	for off := 0; off < size; off += tensor {
		fillTensor(rng, b[off:min(off+tensor, size)])
	}
	return b
}

// Mutate returns a copy of b with about frac of its tensors rewritten (a
// fine-tune that touched some of them).
func Mutate(b []byte, seed int64, frac float64, tensor int) []byte {
	out := append([]byte(nil), b...)
	rng := rand.New(rand.NewSource(seed))
	n := (len(b) + tensor - 1) / tensor
	for _, i := range rng.Perm(n)[:int(float64(n)*frac+0.5)] {
		fillTensor(rng, out[i*tensor:min((i+1)*tensor, len(b))])
	}
	return out
}

func fillTensor(rng *rand.Rand, b []byte) {
	exp := byte(0x3c + rng.Intn(4))
	for i := 0; i+4 <= len(b); i += 4 {
		v := rng.Uint32()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16)&0x7f|0x80*byte(v>>31), exp
	}
	for i := len(b) &^ 3; i < len(b); i++ {
		b[i] = byte(rng.Intn(256))
	}
}
