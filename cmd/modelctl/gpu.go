package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
)

// signatureFlags reads a kernel cache signature policy from the pull
// flags. Keys are read here and sent inline, so the daemon never opens a
// path a client names.
func signatureFlags(c *cli.Context) (*api.SignaturePolicy, error) {
	p := &api.SignaturePolicy{Policy: c.String("signature-policy"), Identity: c.String("identity"), IdentityRegexp: c.String("identity-regexp"),
		Issuer: c.String("issuer"), IssuerRegexp: c.String("issuer-regexp")}
	if p.Policy != api.PolicyRequired && p.Policy != api.PolicyOff {
		return nil, usagef("pull: --signature-policy %q: use required or off", p.Policy)
	}
	if tr := c.String("trusted-root"); tr != "" {
		// The daemon takes no paths from the socket: send the content.
		b, err := os.ReadFile(tr)
		if err != nil {
			return nil, usagef("pull: --trusted-root: %v", err)
		}
		p.TrustedRoot = string(b)
	}
	for _, k := range c.StringSlice("key") {
		b, err := os.ReadFile(k)
		if err != nil {
			return nil, usagef("pull: --key: %v", err)
		}
		p.Keys = append(p.Keys, string(b))
	}
	if p.Policy == api.PolicyRequired && len(p.Keys) == 0 && p.Identity == "" && p.IdentityRegexp == "" &&
		(c.String("kind") == api.KindKernelCache || len(c.StringSlice("kernel-cache")) > 0) {
		return nil, usagef("pull: a kernel cache must be signed: give --key cosign.pub, or --identity/--issuer/--trusted-root for keyless, or --signature-policy off")
	}
	return p, nil
}

func printGPU(w io.Writer, g *api.GPUInventory) {
	src := g.Source
	if g.Simulated {
		src += " (SIMULATED: not read from the hardware)"
	}
	fmt.Fprintf(w, "source: %s\n", src)
	if g.DriverVersion != "" || g.CUDADriverVersion != "" {
		fmt.Fprintf(w, "driver: %s  CUDA: %s\n", g.DriverVersion, g.CUDADriverVersion)
	}
	if g.Reason != "" {
		fmt.Fprintf(w, "note:   %s\n", g.Reason)
	}
	if len(g.Devices) == 0 {
		fmt.Fprintln(w, "no GPU")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tNAME\tUUID\tCOMPUTE\tARCHITECTURE\tMEMORY")
	for _, d := range g.Devices {
		target := d.Arch
		if d.Backend == "cuda" {
			target = d.ComputeCapability + " (sm_" + d.Arch + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", d.Index, d.Name, d.UUID, target, d.Architecture, api.FormatBytes(int64(d.MemoryBytes)))
	}
	tw.Flush()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
