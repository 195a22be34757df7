package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/modelcache/modelcache/api"
)

// listTable is modelctl list for people: the source cut to keep a row on
// one line of a terminal, unless wide; the header row unless noHeaders.
func listTable(w io.Writer, list []api.ArtifactRow, now time.Time, wide, noHeaders bool) {
	header := []string{"NAME", "PHASE", "ENTRY", "REVISION", "SIZE", "AGE", "PINNED", "IN USE", "SOURCE / MESSAGE"}
	first := 1 // the row list[0] is written as
	if noHeaders {
		first = 0
	}
	writeColumns(w, len(list)+first, func(i int, row []string) []string {
		if i < first {
			return append(row, header...)
		}
		a := &list[i-first]
		detail := a.URI
		if a.Phase != api.PhaseReady && a.Message != "" {
			detail = a.Message
		}
		size := api.FormatBytes(a.Bytes)
		if pr := a.Progress; pr != nil && a.Phase == api.PhaseDownloading {
			detail = progressText(pr)
			if pr.BytesTotal > 0 { // what it will be, not the 0 B it is
				size = api.FormatBytes(pr.BytesTotal)
			}
		}
		if n := a.Next; n != nil && a.Phase == api.PhaseReady {
			detail = "next " + nextText(n)
		}
		if !wide {
			detail = fit(detail, 60)
		}
		age := "-"
		if a.Created != nil {
			age = humanAge(now.Sub(*a.Created))
		}
		entry := a.Entry // declared or ad-hoc (docs/capacity.md)
		if entry == "" {
			entry = "-"
		}
		return append(row, a.Name, string(a.Phase), entry, short(a.Revision), size, age, strconv.FormatBool(a.Pinned), inUseText(a.InUse), detail)
	})
}

// writeColumns writes n rows of cells in columns, byte for byte as
// text/tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) writes them tab-separated
// (each column as wide as its widest cell in runes plus two spaces, the
// last cell of a row unpadded), without tabwriter's per-byte work. row(i,
// dst) appends row i's cells to dst; every row has as many cells as the
// first. It is called twice per row, once to size the columns and once
// to write, so that no table of all the cells is kept: for the 10,000
// rows of a large list, the memory each new page of a short-lived
// process costs was most of the table's time (a page fault is a
// hypervisor round trip on a VM: docs/benchmarks.md). Rows that hold a character tabwriter treats
// specially (tab, newline, vertical tab, form feed, its escape 0xff) go
// through tabwriter itself.
func writeColumns(w io.Writer, n int, row func(i int, dst []string) []string) {
	if n == 0 {
		return
	}
	var widths []int
	r := make([]string, 0, 16)
	for i := range n {
		r = row(i, r[:0])
		if widths == nil {
			widths = make([]int, len(r)-1)
		}
		for j, c := range r {
			if strings.ContainsAny(c, "\t\n\v\f\xff") {
				tabwrite(w, n, row)
				return
			}
			if j < len(widths) {
				widths[j] = max(widths[j], utf8.RuneCountInString(c))
			}
		}
	}
	const spaces = "                                                                "
	b := bufio.NewWriterSize(w, 64<<10)
	for i := range n {
		r = row(i, r[:0])
		for j, c := range r[:len(widths)] {
			b.WriteString(c)
			for pad := widths[j] + 2 - utf8.RuneCountInString(c); pad > 0; pad -= len(spaces) {
				b.WriteString(spaces[:min(pad, len(spaces))])
			}
		}
		b.WriteString(r[len(widths)])
		b.WriteByte('\n')
	}
	b.Flush()
}

// tabwrite is writeColumns through text/tabwriter.
func tabwrite(w io.Writer, n int, row func(i int, dst []string) []string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i := range n {
		fmt.Fprintln(tw, strings.Join(row(i, nil), "\t"))
	}
	tw.Flush()
}

// nextText is a rollout's next revision in a few words.
func nextText(n *api.NextRevision) string {
	s := string(n.Phase)
	if n.Revision != "" {
		s = short(n.Revision) + " " + s
	}
	if pr := n.Progress; pr != nil && n.Phase == api.PhaseDownloading {
		s += ": " + progressText(pr)
	} else if n.Message != "" {
		s += ": " + n.Message
	}
	return s
}

// humanAge is kubectl's AGE: 45s, 12m, 5h, 3d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// describe is modelctl inspect for people, in the manner of kubectl
// describe: sizes and rates in units, times as ages; -o json and -o yaml
// carry the exact numbers.
func describe(w io.Writer, a *api.Artifact, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	field := func(k, format string, args ...any) {
		if k != "" { // "": a further line of the field above
			k += ":"
		}
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...)
	}
	ago := func(t time.Time) string {
		return t.Local().Format("2006-01-02 15:04:05") + " (" + humanAge(now.Sub(t)) + " ago)"
	}
	field("Name", "%s", a.Name)
	field("Kind", "%s", a.Kind)
	field("Phase", "%s", a.Phase)
	if a.Message != "" {
		field("Message", "%s", a.Message)
	}
	if a.Reason != "" {
		field("Reason", "%s", a.Reason)
	}
	if a.NextRetry != nil {
		field("Next retry", "in %s (attempt %d failed)", humanDuration(a.NextRetry.Sub(now)), a.Attempts)
	}
	if pr := a.Progress; pr != nil && a.Phase == api.PhaseDownloading {
		field("Progress", "%s", progressText(pr))
	}
	field("Source", "%s", a.URI)
	if a.Revision != "" {
		field("Revision", "%s (the source's immutable version: a commit, a manifest digest, an object version)", a.Revision)
	}
	if n := a.Next; n != nil {
		field("Next", "%s (a rollout's revision, prefetched while Revision serves; current moves to it when the cluster flips)", nextText(n))
	}
	if a.ManifestDigest != "" {
		field("Manifest digest", "%s (the folder checksum of the files; give it to pull --digest to require exactly this content)", a.ManifestDigest)
	}
	if a.Bytes > 0 {
		field("Size", "%s", api.FormatBytes(a.Bytes))
	}
	field("Pinned", "%v", a.Pinned)
	if a.Path != "" {
		field("Path", "%s", a.Path)
	}
	if r := a.Resident; r != nil {
		field("Resident", "%s", residentText(r))
	}
	if a.Created != nil {
		field("Created", "%s", ago(*a.Created))
	}
	if a.LastUsed != nil {
		field("Last used", "%s", ago(*a.LastUsed))
	}
	if lp := a.LastPull; lp != nil {
		took := time.Duration(lp.Seconds * float64(time.Second))
		field("Last pull", "%s fetched in %s (%s/s), %s", api.FormatBytes(lp.BytesFetched), humanDuration(took), api.FormatBytes(int64(lp.BytesPerSecond)), ago(lp.At))
		// As a ModelCacheNode reports it (downloadStarted, downloadCompleted).
		field("Downloaded", "started %s, completed %s", lp.At.Add(-took).UTC().Format(time.RFC3339), lp.At.UTC().Format(time.RFC3339))
		if lp.BytesFromPeers > 0 {
			field("From peers", "%s of %s (the rest from the origin)", api.FormatBytes(lp.BytesFromPeers), api.FormatBytes(lp.BytesFetched))
			paths := slices.Sorted(maps.Keys(lp.FilesFromPeers))
			for _, p := range paths {
				field("  "+p, "%s", strings.Join(lp.FilesFromPeers[p], ", "))
			}
		}
	}
	if len(a.InUse) > 0 {
		var hs []string
		for _, h := range a.InUse {
			hs = append(hs, h.String())
		}
		field("In use by", "%s", strings.Join(hs, ", "))
	}
	if d := a.Desire; d != nil {
		field("Desired", "%s", desiredText(d))
	}
	if m := a.Metadata; m != nil {
		describeMetadata(field, m)
	}
	if kc := a.KernelCache; kc != nil {
		describeKernelCache(field, kc)
	}
	tw.Flush()
	if len(a.Versions) > 0 {
		describeVersions(w, a, now)
	}
}

// residentText says how much of the current revision is in the page
// cache.
func residentText(r *api.Residency) string {
	pct := 0
	if r.Total > 0 {
		pct = int(r.Bytes * 100 / r.Total)
	}
	return fmt.Sprintf("%s of %s in the page cache (%d%%; modelctl warm reads it in)", api.FormatBytes(r.Bytes), api.FormatBytes(r.Total), pct)
}

// fieldFunc writes one "Key: value" line of describe ("" as the key: a
// further line of the field above).
type fieldFunc func(k, format string, args ...any)

// desiredText is describe's Desired line: where the desire comes from and
// what it asks for.
func desiredText(d *api.Desire) string {
	s := "from " + d.Origin
	if d.Digest != "" {
		s += ", digest " + d.Digest
	}
	if len(d.Include) > 0 {
		s += ", include " + strings.Join(d.Include, " ")
	}
	if len(d.Exclude) > 0 {
		s += ", exclude " + strings.Join(d.Exclude, " ")
	}
	if d.Serves != "" {
		s += ", serves " + d.Serves
	}
	if d.Policy != "" {
		s += ", update policy " + d.Policy
	}
	for _, kc := range d.KernelCaches {
		s += ", kernel cache " + kc.URI
	}
	return s
}

// describeMetadata writes the model's metadata fields.
func describeMetadata(field fieldFunc, m *api.Metadata) {
	if len(m.Architectures) > 0 || m.ModelType != "" {
		field("Architecture", "%s %s", strings.Join(m.Architectures, ", "), m.ModelType)
	}
	if m.TorchDtype != "" {
		field("Dtype", "%s", m.TorchDtype)
	}
	if m.Parameters > 0 {
		field("Parameters", "%s (%d)", humanCount(m.Parameters), m.Parameters)
	}
	if m.TensorBytes > 0 {
		field("Tensors", "%s in %d safetensors file(s)", api.FormatBytes(m.TensorBytes), m.SafetensorsFiles)
	}
	if m.MaxPositionEmbeddings > 0 {
		field("Context", "%d tokens", m.MaxPositionEmbeddings)
	}
	for _, p := range m.Problems {
		field("Metadata problem", "%s", p)
	}
}

// describeKernelCache writes a kernel cache's signature, its
// compatibility with this node's GPUs and its size.
func describeKernelCache(field fieldFunc, kc *api.KernelCacheInfo) {
	if s := kc.Signature; s != nil {
		field("Signature", "policy %s, verified %v %s %s", s.Policy, s.Verified, s.Format, s.Signer)
	}
	if c := kc.Compatibility; c != nil {
		v := "compatible"
		if !c.Compatible {
			v = "incompatible"
		}
		if c.Simulated {
			v += " (simulated GPUs)"
		}
		if c.Reason != "" {
			v += ": " + c.Reason
		}
		field("This node", "%s", v)
		for _, d := range c.Devices {
			line := fmt.Sprintf("GPU %d %s: compatible %v, %d entries", d.Index, d.Name, d.Compatible, d.Entries)
			if d.Reason != "" {
				line += " (" + d.Reason + ")"
			}
			field("", "%s", line)
		}
	}
	if kc.CacheBytes > 0 {
		field("Kernel cache", "%s in %d entries under %s", api.FormatBytes(kc.CacheBytes), kc.Entries, strings.Join(kc.Dirs, ", "))
	}
}

// describeVersions writes the versions table and the current version's
// files.
func describeVersions(w io.Writer, a *api.Artifact, now time.Time) {
	fmt.Fprintln(w, "Versions:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  REVISION\tSTATE\tSIZE\tPINNED\tAGE\tMANIFEST DIGEST")
	for _, v := range a.Versions {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%v\t%s\t%s\n", short(v.Revision), v.State, api.FormatBytes(v.Bytes), v.Pinned, humanAge(now.Sub(v.Created)), v.ManifestDigest)
	}
	tw.Flush()
	for _, v := range a.Versions {
		if v.Revision != a.Revision || len(v.Files) == 0 {
			continue
		}
		fmt.Fprintf(w, "Files (%d):\n", len(v.Files))
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, f := range v.Files {
			check := ""
			if f.Streamed {
				check = "\t(size only: the source lists no digest)"
			}
			if len(f.Peers) > 0 {
				check += "\t(from peers: " + strings.Join(f.Peers, ", ") + ")"
			}
			switch f.Transport {
			case api.TransportXet:
				check += "\t(via xet: rebuilt from chunks)"
			case api.TransportResolve:
				check += "\t(via resolve URL: whole file)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s%s\n", f.Path, api.FormatBytes(f.Size), f.Digest, check)
		}
		tw.Flush()
	}
}

// humanCount is a parameter count as model cards write it: 8.03B, 350M.
func humanCount(n int64) string {
	switch {
	case n >= 1e12:
		return fmt.Sprintf("%.2fT", float64(n)/1e12)
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
