//go:build !purego

package xet

// ungroupBlocks interleaves blocks*16 bytes of each of the groups
// a, b, c, d into dst (blocks*64 bytes) with SSE2 (every amd64 has it),
// and returns blocks.
func ungroupBlocks(dst, a, b, c, d []byte, blocks int) int {
	if blocks <= 0 {
		return 0
	}
	_ = dst[blocks*64-1]
	_, _, _, _ = a[blocks*16-1], b[blocks*16-1], c[blocks*16-1], d[blocks*16-1]
	ungroupSSE2(&dst[0], &a[0], &b[0], &c[0], &d[0], blocks)
	return blocks
}

//go:noescape
func ungroupSSE2(dst, a, b, c, d *byte, blocks int)
