package nodepool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultBudget is Config.Budget's default: the populated bytes the helper
// keeps ready (a 256 MiB state dict's copy, with room for a second one's
// refill under way).
const DefaultBudget = 512 << 20

// DefaultIdle is Config.Idle's default: how long the helper outlives its
// last client, so actors that replace each other (a restarted job, the
// next cold run) find the pool warm.
const DefaultIdle = 10 * time.Second

// DefaultSettle is Config.Settle's default. A take starts a transfer on
// the node (its copy, its reads), and populating a segment beside it takes
// the cores that transfer runs on: at nice 19 a third of a busy core, which
// slowed a cold 256 MiB transfer between two Ray nodes of a 2-core machine
// by tens of milliseconds. The filler waits until the takes have settled.
const DefaultSettle = 250 * time.Millisecond

// settleBound bounds the filler's wait for settled takes, in Settles.
const settleBound = 4

// SocketName is the helper's socket in a runtime directory.
const SocketName = "nodepool.sock"

// ErrRunning is returned by Serve when another helper serves the socket.
var ErrRunning = errors.New("nodepool: another helper serves this socket")

// Config configures Serve. Zero values mean the documented defaults.
type Config struct {
	// Socket is the unix socket's path; default SocketName in the
	// current directory.
	Socket string
	// Budget bounds the populated bytes held ready; default
	// DefaultBudget. Requests for more are misses.
	Budget int64
	// Idle is how long the helper runs with no client; default DefaultIdle.
	Idle time.Duration
	// Settle is how long the filler waits after the last take before it
	// makes a segment (while takes keep coming, at most four times as
	// long); default DefaultSettle, negative for no wait.
	Settle time.Duration
	// Logger; default discards.
	Logger *slog.Logger
}

// The wire: SOCK_SEQPACKET messages, little-endian.
//
//	request:  op(1) size(8)
//	response: status(1) size(8) ready(8) hits(8) misses(8), with the memfd
//	          as SCM_RIGHTS when status is statusOK
const (
	opTake  = 1
	opStats = 2

	statusOK    = 0
	statusEmpty = 1 // nothing ready that large: a miss
	statusLarge = 2 // larger than the budget: always a miss

	reqLen  = 9
	respLen = 33
)

// minSegment is the smallest segment the helper makes, and sizes are
// rounded up to it (a slab's populate chunk).
const minSegment = 2 << 20

// ServerStats is what a helper reports (opStats, and with every take).
type ServerStats struct {
	Ready  int64 // populated bytes held ready
	Hits   int64 // takes served
	Misses int64 // takes that found nothing large enough
}

// server is one helper's state.
type server struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	ready   []*poolSeg // sorted by size, ascending
	bytes   int64      // in ready
	recent  []int64    // sizes asked for lately, most recent first
	tookAt  time.Time  // the last take
	clients int
	idleAt  time.Time // when clients dropped to 0
	stats   ServerStats
	wake    chan struct{} // the filler has work
}

type poolSeg struct {
	fd   int
	size int64
}

// Serve runs a helper until ctx ends or no client has been connected for
// cfg.Idle, then removes its socket and frees what it holds. It returns
// ErrRunning at once when another helper holds the socket's lock.
func Serve(ctx context.Context, cfg Config) error {
	if cfg.Socket == "" {
		cfg.Socket = SocketName
	}
	if cfg.Budget <= 0 {
		cfg.Budget = DefaultBudget
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdle
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lock, err := os.OpenFile(cfg.Socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("nodepool: lock: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return ErrRunning
		}
		return fmt.Errorf("nodepool: lock: %w", err)
	}
	// Held: a socket file left by a helper that died is stale.
	_ = os.Remove(cfg.Socket)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Socket, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("nodepool: listen: %w", err)
	}
	ln.SetUnlinkOnClose(false) // removed below, while the lock is held
	s := &server{cfg: cfg, log: log, idleAt: time.Now(), wake: make(chan struct{}, 1)}
	log.Info("nodepool: serving", "socket", cfg.Socket, "budget", cfg.Budget, "idle", cfg.Idle)

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	conns := map[*net.UnixConn]struct{}{}
	var connsMu sync.Mutex
	wg.Go(func() { s.fill(ctx) })
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				cancel() // the listener closed (ctx ended) or broke: stop
				return
			}
			connsMu.Lock()
			conns[c] = struct{}{}
			connsMu.Unlock()
			s.mu.Lock()
			s.clients++
			s.mu.Unlock()
			wg.Go(func() {
				s.serveConn(c)
				c.Close()
				connsMu.Lock()
				delete(conns, c)
				connsMu.Unlock()
				s.mu.Lock()
				if s.clients--; s.clients == 0 {
					s.idleAt = time.Now()
				}
				s.mu.Unlock()
			})
		}
	})
	tick := time.NewTicker(min(cfg.Idle/4, time.Second))
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			s.mu.Lock()
			idle := s.clients == 0 && time.Since(s.idleAt) >= cfg.Idle
			s.mu.Unlock()
			if idle {
				log.Info("nodepool: no client left, ending", "idle", cfg.Idle)
				done = true
			}
		}
	}
	tick.Stop()
	cancel()
	_ = os.Remove(cfg.Socket) // before the lock goes: a new helper makes its own
	ln.Close()
	connsMu.Lock()
	for c := range conns {
		c.Close()
	}
	connsMu.Unlock()
	wg.Wait()
	s.mu.Lock()
	for _, g := range s.ready {
		unix.Close(g.fd)
	}
	s.ready, s.bytes = nil, 0
	s.mu.Unlock()
	return nil
}

// serveConn answers one client's requests until it hangs up.
func (s *server) serveConn(c *net.UnixConn) {
	buf := make([]byte, reqLen)
	for {
		n, err := c.Read(buf)
		if err != nil || n != reqLen {
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("nodepool: client read", "err", err)
			}
			return
		}
		size := int64(binary.LittleEndian.Uint64(buf[1:]))
		var status byte = statusOK
		seg := (*poolSeg)(nil)
		switch buf[0] {
		case opTake:
			status, seg = s.take(size)
		case opStats:
		default:
			return // not our client
		}
		resp := make([]byte, respLen)
		resp[0] = status
		s.mu.Lock()
		st := s.stats
		st.Ready = s.bytes
		s.mu.Unlock()
		if seg != nil {
			binary.LittleEndian.PutUint64(resp[1:], uint64(seg.size))
		}
		binary.LittleEndian.PutUint64(resp[9:], uint64(st.Ready))
		binary.LittleEndian.PutUint64(resp[17:], uint64(st.Hits))
		binary.LittleEndian.PutUint64(resp[25:], uint64(st.Misses))
		var oob []byte
		if seg != nil {
			oob = unix.UnixRights(seg.fd)
		}
		_, _, err = c.WriteMsgUnix(resp, oob, nil)
		if seg != nil {
			// Sent or not, the helper lets go: memory it handed out is
			// the client's alone (a failed send frees it).
			unix.Close(seg.fd)
		}
		if err != nil {
			return
		}
	}
}

// fits reports whether a segment of n bytes serves a request of want:
// large enough, and not so large that the request wastes most of it (a
// 64 MiB slab must not take the segment kept for a 256 MiB state dict).
func fits(n, want int64) bool { return n >= want && n <= want+max(want, 64<<20) }

// take hands out the smallest ready segment that fits a request of size
// bytes.
func (s *server) take(size int64) (byte, *poolSeg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if size <= 0 || size > s.cfg.Budget {
		s.stats.Misses++
		return statusLarge, nil
	}
	want := roundUp(size)
	s.tookAt = time.Now()
	s.recent = slices.DeleteFunc(s.recent, func(r int64) bool { return r == want })
	s.recent = slices.Insert(s.recent, 0, want)
	if len(s.recent) > 4 {
		s.recent = s.recent[:4]
	}
	defer s.kick()
	i := slices.IndexFunc(s.ready, func(g *poolSeg) bool { return fits(g.size, want) })
	if i < 0 {
		s.stats.Misses++
		s.log.Debug("nodepool: miss", "want", want, "ready", s.bytes, "recent", s.recent)
		return statusEmpty, nil
	}
	g := s.ready[i]
	s.ready = slices.Delete(s.ready, i, i+1)
	s.bytes -= g.size
	s.stats.Hits++
	s.log.Debug("nodepool: take", "want", want, "got", g.size, "ready", s.bytes)
	return statusOK, g
}

func (s *server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// nextSize is the segment the filler makes next, 0 for none; s.mu is held.
// With nothing asked yet, the budget in a ladder of halving segments
// (firstPiece); after that, a segment for each size asked lately that no
// ready segment fits, largest first, making room by freeing ready segments
// that fit none of the sizes asked as lately as it or later. Largest first: fresh pages cost by the byte, and the large
// allocation (a state dict's copy) is the one on a transfer's path, while
// a stream of 64 MiB slabs (a trainer making its arrays) would otherwise
// keep the filler from ever reaching it.
func (s *server) nextSize() int64 {
	if len(s.recent) == 0 {
		return firstPiece(s.cfg.Budget - s.bytes)
	}
	bySize := slices.Sorted(slices.Values(s.recent))
	slices.Reverse(bySize)
	for _, r := range bySize {
		if slices.ContainsFunc(s.ready, func(g *poolSeg) bool { return fits(g.size, r) }) {
			continue
		}
		// Room for r may evict what serves only sizes asked before r.
		newer := s.recent[:slices.Index(s.recent, r)+1]
		for s.cfg.Budget-s.bytes < r && s.evictUnfit(newer) {
		}
		if r <= s.cfg.Budget-s.bytes {
			return r
		}
	}
	return 0
}

// firstPiece is the next segment of the ladder a helper fills before
// anything was asked, given the free bytes of its budget: half of them
// while the half is at least ladderFloor, then all that is left. A budget
// of 512 MiB becomes 256, 128, 64 and 64 MiB, so the first ask of any size
// up to half the budget finds a segment that fits it (a 64 MiB slab, a
// 200 MiB state dict), where one segment of the whole budget fits only
// asks of half of it or more and the node's first transfers would miss.
func firstPiece(free int64) int64 {
	free &^= minSegment - 1
	if half := (free / 2) &^ (minSegment - 1); half >= ladderFloor && free > ladderFloor {
		return half
	}
	return free
}

// ladderFloor is the smallest step of firstPiece's ladder: fits gives a
// request up to 64 MiB of slack, so a 64 MiB segment serves every ask up
// to 64 MiB.
const ladderFloor = 64 << 20

// evictUnfit frees the largest ready segment that fits none of sizes;
// s.mu is held.
func (s *server) evictUnfit(sizes []int64) bool {
	for i := len(s.ready) - 1; i >= 0; i-- {
		g := s.ready[i]
		if !slices.ContainsFunc(sizes, func(r int64) bool { return fits(g.size, r) }) {
			unix.Close(g.fd)
			s.ready = slices.Delete(s.ready, i, i+1)
			s.bytes -= g.size
			return true
		}
	}
	return false
}

// fill keeps the budget populated, one segment at a time, until ctx ends.
// A refill is due right after a runtime took memory, usually while that
// runtime's transfer (and its readers) run on the same cores, and must not
// slow them: it waits until the takes have settled (Config.Settle) and
// runs on a thread of its own at the lowest priority.
func (s *server) fill(ctx context.Context) {
	runtime.LockOSThread() // the thread ends with the goroutine: its priority goes with it
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
	var due time.Time // when the segment waiting for the takes to settle was first due
	for {
		s.mu.Lock()
		n := s.nextSize()
		wait := s.cfg.Settle - time.Since(s.tookAt)
		s.mu.Unlock()
		if n != 0 && due.IsZero() {
			due = time.Now()
		}
		// A stream of takes (a trainer making its arrays) never settles:
		// the wait is bounded, or the pool would drain for good.
		if left := settleBound*s.cfg.Settle - time.Since(due); n != 0 && wait > 0 && left > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(wait, left)):
				continue // a take may have come meanwhile: look again
			}
		}
		due = time.Time{}
		if n == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		fd, err := populated(n)
		if err != nil {
			s.log.Warn("nodepool: cannot make a segment", "bytes", n, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		s.log.Debug("nodepool: made", "bytes", n)
		s.mu.Lock()
		i, _ := slices.BinarySearchFunc(s.ready, n, func(g *poolSeg, n int64) int { return int(g.size - n) })
		s.ready = slices.Insert(s.ready, i, &poolSeg{fd: fd, size: n})
		s.bytes += n
		s.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
}

// populated makes a memfd of n bytes whose pages are resident. Its mode is
// 0400 and its size unsealed (the client seals it at the size it keeps),
// as tensor's own segments are made; the helper's mapping goes once the
// pages are in: they belong to the file.
func populated(n int64) (int, error) {
	fd, err := unix.MemfdCreate("tensorlane-nodepool", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, n); err != nil {
		return fail("size memfd", err)
	}
	if err := unix.Fchmod(fd, 0o400); err != nil {
		return fail("make memfd read-only to reopeners", err)
	}
	data, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("map memfd", err)
	}
	// One core: the helper refills in the background, beside the work
	// of the node's actors. Kernels before 5.14 lack MADV_POPULATE_WRITE:
	// touch each page instead.
	if unix.Madvise(data, unix.MADV_POPULATE_WRITE) != nil {
		for i := 0; i < len(data); i += 4096 {
			data[i] = 0
		}
	}
	if err := unix.Munmap(data); err != nil {
		return fail("unmap memfd", err)
	}
	return fd, nil
}

func roundUp(n int64) int64 { return (n + minSegment - 1) &^ (minSegment - 1) }
