//go:build ofi

package ofi

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// epollOfPipe is a stand-in for a provider's wait fd: an epoll set that
// holds the read end of a pipe. Writing the pipe is an event in the set.
func epollOfPipe(t *testing.T) (epfd int, write func()) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, p[0], &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(p[0])}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(epfd); unix.Close(p[0]); unix.Close(p[1]) })
	return epfd, func() { unix.Write(p[1], []byte{1}) }
}

// TestFDWaiter: an event that comes after fi_trywait looked (here, while
// mayWait runs) ends the sleep, though the set was readable before it
// and stays so (a level the netpoller does not see again); a waiter that
// may not sleep does not; closing the waiter ends a sleep. The sleeps are
// given a minute: a lost wake-up shows as a test that does not end.
func TestFDWaiter(t *testing.T) {
	epfd, write := epollOfPipe(t)
	w := newFDWaiter(epfd)
	if w == nil {
		t.Fatal("the runtime cannot watch an epoll fd")
	}
	defer w.close()
	write() // readable from now on: stale, as the provider's set can be
	if slept := w.wait(time.Minute, func() bool { write(); return true }); !slept {
		t.Fatal("mayWait allowed a sleep, but wait says it did not sleep")
	}
	if slept := w.wait(time.Minute, func() bool { return false }); slept {
		t.Fatal("mayWait refused a sleep, but wait slept")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.wait(time.Minute, func() bool { return true })
	}()
	w.close()
	<-done
}
