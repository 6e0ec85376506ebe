//go:build ofi

package ofi

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fdWaiter sleeps on a libfabric wait fd (an epoll set of the provider's
// sockets and its signal) through the Go runtime's netpoller instead of a
// poll(2) that blocks a thread. The netpoller watches the fd edge-triggered:
// a waiter wakes when something new happens in the set (a response
// arrives, fi_cq_signal), not merely because it is readable, which the net
// provider's set stays even while nothing can be read; and the waking
// goroutine is run by a thread that is already awake rather than one the
// kernel has to schedule back from a syscall.
type fdWaiter struct {
	fd int // the libfabric fd it watches
	f  *os.File
	rc syscall.RawConn
}

// newFDWaiter watches fd through a duplicate (libfabric keeps and closes
// its own). It returns nil when the runtime cannot poll it; callers then
// fall back to pollFD.
func newFDWaiter(fd int) *fdWaiter {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	// O_NONBLOCK is what makes os.NewFile hand the fd to the netpoller. It
	// is shared with libfabric's fd (one open file description) and means
	// nothing for an epoll fd, which is never read.
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil
	}
	f := os.NewFile(uintptr(dup), "ofi-wait")
	if f == nil {
		unix.Close(dup)
		return nil
	}
	if err := f.SetReadDeadline(time.Time{}); err != nil { // not pollable
		f.Close()
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil
	}
	return &fdWaiter{fd: fd, f: f, rc: rc}
}

// wait sleeps until the next event in the set or for d, if mayWait (which
// runs fi_trywait) allows it, and reports whether it slept. mayWait runs
// after the netpoller forgot earlier events, so an event that comes after
// fi_trywait looked always ends the sleep. One goroutine waits at a time.
func (w *fdWaiter) wait(d time.Duration, mayWait func() bool) (slept bool) {
	w.f.SetReadDeadline(time.Now().Add(d))
	asked := false
	w.rc.Read(func(uintptr) bool {
		if asked {
			return true // woken (or timed out)
		}
		asked = true
		slept = mayWait()
		return !slept
	})
	return slept
}

// close ends the watch; a wait in progress returns.
func (w *fdWaiter) close() {
	if w != nil {
		w.f.Close()
	}
}
