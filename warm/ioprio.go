package warm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// From linux/ioprio.h.
const (
	ioprioClassIdle  = 3
	ioprioClassShift = 13
	ioprioWhoProcess = 1
)

// idleThread puts the calling OS thread at idle I/O priority: the block
// layer serves its reads only when no other reads or writes wait (BFQ and
// mq-deadline honour the class, the none scheduler ignores it). Its CPU
// priority stays: a warm spends little CPU, and at nice 19 on busy cores
// it would hardly run. The priority is per thread on Linux: the caller
// must have locked its goroutine to the thread (runtime.LockOSThread) and
// must never unlock it, so that the thread exits with the goroutine and
// no other goroutine runs on it at this priority.
func idleThread() error {
	tid := unix.Gettid()
	if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), ioprioClassIdle<<ioprioClassShift); e != 0 {
		return fmt.Errorf("warm: ioprio_set idle: %w", e)
	}
	return nil
}

// threadIOPrio is the I/O priority of the calling thread (ioprio_get),
// for tests.
func threadIOPrio() (class int, err error) {
	const ioprioGet = unix.SYS_IOPRIO_GET
	r, _, e := unix.Syscall(ioprioGet, ioprioWhoProcess, uintptr(unix.Gettid()), 0)
	if e != 0 {
		return 0, e
	}
	return int(r) >> ioprioClassShift, nil
}
