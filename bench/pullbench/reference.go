package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The reference pipeline is the fastest verified pull of the study that
// set the project's performance goals, as a program of its own with none
// of the daemon's duties (no index, no resume, no limits, no API): one
// connection per file, all files at once as the daemon fetches them, four
// 8 MiB buffers per file (the fastest sizes tried on this machine), sha256
// on one goroutine and O_DIRECT writes on another, the digest checked and
// the file fsynced. The bench runs it in the same run as curl and the
// daemon, so the http rows say how far the daemon is from what the machine
// allows a verified pull, not only from a peer that verifies nothing.
const (
	refBufSize = 8 << 20
	refBuffers = 4
)

// referenceMain is `pullbench reference DIR URL#sha256=HEX...`: it pulls
// each URL into DIR and exits non-zero on any error or digest mismatch.
func referenceMain(args []string) {
	if len(args) < 2 {
		must(fmt.Errorf("usage: pullbench reference DIR URL#sha256=HEX..."))
	}
	errs := make(chan error, len(args)-1)
	for _, u := range args[1:] {
		go func() {
			url, sum, _ := strings.Cut(u, "#sha256=")
			errs <- referencePull(url, filepath.Join(args[0], filepath.Base(url)), sum)
		}()
	}
	for range args[1:] {
		must(<-errs)
	}
	must(syncDir(args[0]))
}

type refBuf struct {
	mem  []byte
	n    int
	pos  int64
	done chan struct{} // hashed and written: one token each
}

func referencePull(url, out, want string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	free := make(chan *refBuf, refBuffers)
	for i := 0; i < refBuffers; i++ {
		mem, err := unix.Mmap(-1, 0, refBufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		defer unix.Munmap(mem)
		b := &refBuf{mem: mem, done: make(chan struct{}, 2)}
		b.done <- struct{}{}
		b.done <- struct{}{}
		free <- b
	}
	hashCh, writeCh := make(chan *refBuf, refBuffers), make(chan *refBuf, refBuffers)
	h := sha256.New()
	go func() {
		for b := range hashCh {
			h.Write(b.mem[:b.n])
			b.done <- struct{}{}
		}
	}()
	werr := make(chan error, 1)
	go func() {
		var err error
		direct := true
		for b := range writeCh {
			if err == nil {
				if direct && b.n%4096 != 0 { // the tail: leave O_DIRECT
					fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
					unix.FcntlInt(f.Fd(), unix.F_SETFL, fl&^syscall.O_DIRECT)
					direct = false
				}
				_, err = f.WriteAt(b.mem[:b.n], b.pos)
			}
			b.done <- struct{}{}
		}
		werr <- err
	}()
	var pos int64
	var rerr error
	for rerr == nil {
		b := <-free
		<-b.done
		<-b.done
		b.n = 0
		for b.n < len(b.mem) && rerr == nil {
			var n int
			n, rerr = resp.Body.Read(b.mem[b.n:])
			b.n += n
		}
		b.pos, pos = pos, pos+int64(b.n)
		if b.n > 0 {
			hashCh <- b
			writeCh <- b
		} else {
			b.done <- struct{}{}
			b.done <- struct{}{}
		}
		free <- b
	}
	close(hashCh)
	close(writeCh)
	if err := <-werr; err != nil {
		return err
	}
	for i := 0; i < refBuffers; i++ { // the hasher is done with every buffer
		b := <-free
		<-b.done
		<-b.done
	}
	if rerr != io.EOF {
		return rerr
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s: sha256 %s, want %s", url, got, want)
	}
	return f.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
