package main

import (
	"fmt"
	"os"
	"strings"
)

// row is one line of the summary table that ends a run (markdown, for
// docs/benchmarks.md): modelcached's figure, the peer's, and the ratio.
type row struct{ scenario, ours, peer, ratio string }

var table []row

func addRow(scenario, ours, peer, ratio string) {
	table = append(table, row{scenario, ours, peer, ratio})
}

func gb(x float64) string { return fmt.Sprintf("%.2f GB/s", x/1e9) }

func printTable() {
	if len(table) == 0 {
		return
	}
	host, _ := os.Hostname()
	fmt.Printf("\n## Summary (%s; medians of %d runs; ratios > 1 favour modelcached for throughput, < 1 for time)\n\n", host, *runs)
	fmt.Println("| scenario | modelcached | peer | ratio |")
	fmt.Println("|---|---|---|---|")
	for _, r := range table {
		fmt.Printf("| %s | %s | %s | %s |\n", r.scenario, r.ours, strings.ReplaceAll(r.peer, "|", "\\|"), r.ratio)
	}
}
