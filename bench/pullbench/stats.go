package main

import (
	"fmt"
	"sort"
)

func gbps(xs []float64) []string { return each(xs, 1e9, "%.2f") }

func secsOrGB(xs []float64, gbs bool) []string {
	if gbs {
		return gbps(xs)
	}
	return secs(xs)
}

// each formats every x/unit with format: the runs behind a median.
func each(xs []float64, unit float64, format string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf(format, x/unit)
	}
	return out
}

// medianIndex is the index of the median of xs (the lower one for an even
// count).
func medianIndex(xs []float64) int {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return xs[idx[a]] < xs[idx[b]] })
	return idx[(len(idx)-1)/2]
}

func ratios(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
