package api

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDialRetriesFullQueue: while the daemon's listen queue is full
// (EAGAIN) the client waits and retries instead of failing the command.
func TestDialRetriesFullQueue(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	lfd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(lfd)
	if err := syscall.Bind(lfd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(lfd, 1); err != nil {
		t.Fatal(err)
	}
	// Fill the queue with connections nobody accepts.
	var held []int
	defer func() {
		for _, fd := range held {
			syscall.Close(fd)
		}
	}()
	for i := 0; ; i++ {
		fd, _ := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
		err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: sock})
		held = append(held, fd)
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if i > 100 {
			t.Fatal("the kernel never reported a full listen queue (EAGAIN) in 100 connections to a queue of 1")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	retried := make(chan struct{}, 1)
	dialRetried = func() {
		select {
		case retried <- struct{}{}:
		default:
		}
	}
	defer func() { dialRetried = nil }()
	done := make(chan error, 1)
	go func() {
		c, err := dialUnix(ctx, sock)
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	// The dial finds the queue full and waits to try again (twice, so
	// that it is seen waiting, not failing), rather than returning.
	for range 2 {
		select {
		case err := <-done:
			t.Fatalf("dial returned while the queue was full: %v", err)
		case <-retried:
		case <-ctx.Done():
			t.Fatal("the dial neither returned nor retried in 20 s")
		}
	}
	// The daemon catches up: it accepts what is queued, without blocking.
	syscall.SetNonblock(lfd, true)
	for {
		if nfd, _, err := syscall.Accept(lfd); err == nil {
			syscall.Close(nfd)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("dial after the queue drained: %v", err)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}
