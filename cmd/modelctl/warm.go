package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
)

// warmCommand asks the daemon to read an artifact's current revision
// into the page cache ahead of the process that will load it; with
// --wait it returns when the warm ends and says why.
func warmCommand() *cli.Command {
	return &cli.Command{
		Name:      "warm",
		Usage:     "read an artifact's current revision into memory (the page cache) ahead of the process that will load it",
		ArgsUsage: "NAME",
		Description: "The daemon reads the files in the order a loader does (configs and tokenizers, then the\n" +
			"safetensors shards in index order), at idle I/O priority and within its memory budget (modelcached\n" +
			"--warm-share and --warm-limit). A warm of the revision that runs already is joined, not repeated.\n" +
			"The daemon warms on its own when a CSI volume is published, modelctl wait returns Ready or\n" +
			"modelctl lease is taken. Without --wait modelctl returns at once; with it, when the warm ends:\n" +
			"resident (exit 0), budget spent (0), overtaken by the consumer's own reads (0), cancelled (1:\n" +
			"the revision was evicted or the daemon stopped) or failed (1).",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "wait", Usage: "wait until the warm ends and say why: resident, budget spent, overtaken or cancelled"},
		},
		Action: func(c *cli.Context) error {
			name := c.Args().First()
			res, err := client(c).Warm(c.Context, name, c.Bool("wait"), nil)
			if err != nil {
				return err
			}
			if err := output(c, res, func(w io.Writer) { fmt.Fprintln(w, warmText(res)) }); err != nil {
				return err
			}
			if res.Reason == api.WarmCancelled || res.Reason == api.WarmFailed {
				return cli.Exit("", exitFailure)
			}
			return nil
		},
	}
}

// warmText is one line for people about a warm.
func warmText(r *api.WarmResult) string {
	what := fmt.Sprintf("%s@%s", r.Name, short(r.Revision))
	if r.Reason != "" {
		return fmt.Sprintf("%s: %s (%s read in %.1fs)", what, r.Message, api.FormatBytes(r.WarmedBytes), r.Seconds)
	}
	if r.Joined {
		return what + ": warming (joined the warm that runs already); modelctl inspect " + r.Name + " shows how much is resident"
	}
	return what + ": warming; modelctl inspect " + r.Name + " shows how much is resident"
}
