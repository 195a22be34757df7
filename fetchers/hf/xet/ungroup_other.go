//go:build !amd64 || purego

package xet

// ungroupBlocks leaves every block to ungroup4's loop where there is no
// vector version.
func ungroupBlocks(dst, a, b, c, d []byte, blocks int) int { return 0 }
