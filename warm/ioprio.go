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

// idleThread puts the calling OS thread at idle I/O priority (the block
// layer serves its reads only when no other reads or writes wait: BFQ and
// mq-deadline honour the class, the none scheduler ignores it) and at the
// lowest CPU priority (nice 19). Both are per thread on Linux: the caller
// must have locked its goroutine to the thread (runtime.LockOSThread) and
// must never unlock it, so that the thread exits with the goroutine and
// no other goroutine runs on it at these priorities.
func idleThread() error {
	tid := unix.Gettid()
	if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), ioprioClassIdle<<ioprioClassShift); e != 0 {
		return fmt.Errorf("warm: ioprio_set idle: %w", e)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, 19); err != nil {
		return fmt.Errorf("warm: setpriority 19: %w", err)
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
