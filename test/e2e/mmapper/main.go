// Command mmapper maps a file read-only, as an inference server maps
// safetensors, closes the descriptor (only the mapping holds the file),
// prints "mapped" and waits until its stdin closes or it is killed. The
// capacity tests use it to show that a mapped model is not evicted.
package main

import (
	"fmt"
	"io"
	"os"
	"syscall"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mmapper FILE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fi, _ := f.Stat()
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f.Close()
	var sum byte
	for i := 0; i < len(mem); i += 4096 {
		sum ^= mem[i] // touch the pages, as a loader would
	}
	fmt.Println("mapped", sum)
	io.Copy(io.Discard, os.Stdin)
}
