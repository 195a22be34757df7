package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/cliutil"
)

// leaseCommand holds a lease on an artifact while modelctl runs: until a
// signal, or while COMMAND runs (its exit code is ours). The lease is
// renewed at a third of its TTL and released on the way out; if modelctl
// dies, it lapses after the TTL.
func leaseCommand() *cli.Command {
	return &cli.Command{
		Name:      "lease",
		Usage:     "keep an artifact from eviction while this runs (until a signal, or while COMMAND runs)",
		ArgsUsage: "NAME [-- COMMAND [ARGS...]]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "holder", Usage: "who holds the lease (a pod, a job, host:pid); default host:pid"},
			&cli.GenericFlag{Name: "ttl", Value: &cliutil.Duration{D: time.Minute}, Usage: "lease lifetime: 90s, 5m, 1h (a bare number is seconds); renewed at a third of it"},
		},
		Action: func(c *cli.Context) error {
			name := c.Args().First()
			holder := c.String("holder")
			if holder == "" {
				h, _ := os.Hostname()
				holder = fmt.Sprintf("%s:%d", h, os.Getpid())
			}
			ttl := c.Generic("ttl").(*cliutil.Duration).D
			if ttl < 3*time.Millisecond {
				return usageError{msgs: []string{fmt.Sprintf("--ttl %s: too short to renew", ttl)}, cmd: "lease"}
			}
			cl := client(c)
			l, err := cl.Lease(c.Context, name, holder, ttl)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "%s: leased revision %s to %s until %s\n", name, short(l.Revision), holder, l.Expires.Format(time.RFC3339))
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := cl.Release(ctx, name, holder); err != nil && !errors.Is(err, api.ErrNotFound) {
					fmt.Fprintf(c.App.ErrWriter, "modelctl: release lease: %v\n", err)
				}
			}()

			done := make(chan error, 1)
			if args := c.Args().Tail(); len(args) > 0 {
				cmd := exec.Command(args[0], args[1:]...)
				cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
				if err := cmd.Start(); err != nil {
					return cannotRun(args[0], err)
				}
				go func() { done <- cmd.Wait() }()
			}
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sig)
			t := time.NewTicker(ttl / 3)
			defer t.Stop()
			for {
				select {
				case err := <-done:
					var ee *exec.ExitError
					if errors.As(err, &ee) {
						return cli.Exit("", ee.ExitCode())
					}
					return err
				case <-sig:
					return nil
				case <-c.Context.Done():
					return nil
				case <-t.C:
					if _, err := cl.Lease(c.Context, name, holder, ttl); err != nil {
						fmt.Fprintf(c.App.ErrWriter, "modelctl: renew lease: %v\n", err)
					}
				}
			}
		},
	}
}

// Exit codes of a COMMAND that cannot run, as a shell reports them.
const (
	exitCannotExecute = 126 // found, but not executable
	exitNotFound      = 127
)

// cannotRun is the error for a COMMAND that did not start: 127 when it
// was not found, 126 when it was found and could not be executed.
func cannotRun(name string, err error) error {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return cli.Exit(fmt.Sprintf("%s: command not found", name), exitNotFound)
	}
	return cli.Exit(fmt.Sprintf("%s: cannot execute: %v", name, errors.Unwrap(err)), exitCannotExecute)
}
