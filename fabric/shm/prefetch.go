package shm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
)

// Slab prefetch. Where the kernel gives shared memory no huge pages
// (shmem_enabled=never), the cost of a reader's first transfer out of an
// owner's slab is mostly building its page tables for the slab's pages
// (about 5 ms per 64 MiB on a small VM): the copy itself is as fast as a
// warm one. So right after a reader's first read of an object in one of
// an owner's slabs, on the same connection, it asks the owner for its
// slabs (opSlabs), maps them read-only, and populates their page tables
// (and those of the owner's slabs it mapped already) in the background, a
// chunk at a time, so a later first Get finds them built. (A view does not
// ask: its connection keeps the view's hold, and an exchange that failed
// would drop it; the next read asks.)
//
// It is bounded (Config.PrefetchBytes of slabs mapped in all; the owner
// sends at most maxAnnounce slabs), cancelled by Close (which waits for
// it), counted (SlabStats, tensorlane_shm_slab_events_total) and logged.
// It asks once per owner for the client's life; slabs the owner creates
// later are mapped at their first grant, as without prefetch. The
// announced slabs belong to the connection that carried them, as a
// grant's would: they stay mapped while that connection lives.
//
// The security model is the slab grants': the owner announces only to
// readers that proved its cluster key and passed its AllowPeer, read-only
// and sealed (docs/security-shm-grants.md).

// The prefetch gives way to reads: it populates only while no transfer of
// this client is in flight (between chunks it waits for them), so it never
// takes a core from a Get's own populate and copy (the chunks it built
// before stay built).

// idleGate counts the client's transfers in flight, and lets the prefetch
// wait until there are none.
type idleGate struct {
	mu   sync.Mutex
	cond sync.Cond // L is &mu (init)
	busy int
}

func (g *idleGate) init() { g.cond.L = &g.mu }

func (g *idleGate) enter() {
	g.mu.Lock()
	g.busy++
	g.mu.Unlock()
}

func (g *idleGate) leave() {
	g.mu.Lock()
	if g.busy--; g.busy == 0 {
		g.cond.Broadcast()
	}
	g.mu.Unlock()
}

// wait returns when no transfer is in flight, or ctx's error when it ends
// first.
func (g *idleGate) wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	})
	defer stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.busy > 0 && ctx.Err() == nil {
		g.cond.Wait()
	}
	return ctx.Err()
}

// prefetchOnce runs, on pc, right after a transfer that succeeded, the
// announcement exchange with pc's owner when pc carried a slab grant and
// this client never asked that owner (nor is closing, nor has prefetch
// off); then it populates, in the background, the slabs it mapped and the
// owner's others mapped already. On pc, because another connection would
// cost the next read a dial; one round trip (bounded by
// announceTimeout), not a transfer. A refusal leaves pc in step; any
// other failure returns errConfirmedLost: the transfer stands, and pc is
// dropped.
func (c *Client) prefetchOnce(pc *pconn) error {
	if c.cfg.PrefetchBytes <= 0 || !c.slabs.holds(pc) {
		return nil
	}
	c.pfMu.Lock()
	if c.pfClosed || c.pfAsked[pc.owner] {
		c.pfMu.Unlock()
		return nil
	}
	c.pfAsked[pc.owner] = true
	c.pfMu.Unlock()
	owner := pc.owner
	var held []*slabMap
	if budget := c.cfg.PrefetchBytes - c.slabs.snapshot().Bytes; budget <= 0 {
		c.slabs.count(func(s *slabs) { s.pfOverBudget++ })
		c.cfg.Logger.Info("shm: slab prefetch skipped: the slabs mapped already fill its budget", "owner", owner, "budget", c.cfg.PrefetchBytes)
	} else {
		var err error
		held, err = c.announced(pc, budget)
		var re *peerauth.RemoteError
		switch {
		case errors.As(err, &re):
			c.cfg.Logger.Debug("shm: owner announces no slabs", "owner", owner, "err", err)
		case err != nil:
			c.cfg.Logger.Debug("shm: slab announcement failed; first reads map slabs as they come", "owner", owner, "err", err)
			return fmt.Errorf("%w: %w", errConfirmedLost, err)
		}
	}
	// The slabs of this owner that came with grants were not announced
	// again: populate them too.
	held = c.slabs.holdOwner(owner, held)
	c.pfMu.Lock()
	defer c.pfMu.Unlock()
	if c.pfClosed {
		for _, m := range held {
			c.slabs.release(m)
		}
		return nil
	}
	c.pfWG.Add(1)
	go func() {
		defer c.pfWG.Done()
		c.populate(owner, held)
	}()
	return nil
}

// announceTimeout bounds the announcement exchange, which runs after a
// transfer has its bytes: a slow owner costs that read at most this.
const announceTimeout = 2 * time.Second

// populate builds the page tables of held's slabs (prefetch.go) and drops
// their references.
func (c *Client) populate(owner string, held []*slabMap) {
	start := time.Now()
	c.slabs.prefetching.Add(1)
	defer c.slabs.prefetching.Add(-1)
	defer func() {
		for _, m := range held {
			c.slabs.release(m)
		}
	}()
	var bytes int64
	for _, m := range held {
		n, err := m.populateAll(c.pfCtx, &c.idle)
		bytes += n
		c.slabs.count(func(s *slabs) { s.pfBytes += n })
		if err != nil {
			c.cfg.Logger.Debug("shm: slab prefetch stopped", "owner", owner, "err", err)
			break
		}
	}
	c.slabs.count(func(s *slabs) { s.pfDone++ })
	if len(held) > 0 {
		c.cfg.Logger.Debug("shm: prefetched the owner's slabs", "owner", owner, "slabs", len(held), "populated_bytes", bytes, "took", time.Since(start))
	}
}

// announced runs one opSlabs exchange on pc and maps what the owner
// announced, returning the slabs with a reference held for the caller.
func (c *Client) announced(pc *pconn, budget int64) ([]*slabMap, error) {
	pc.c.SetDeadline(time.Now().Add(min(c.cfg.StallTimeout, announceTimeout)))
	pc.out = request{op: opSlabs, length: budget}.appendTo(pc.out[:0])
	if err := sendPacket(pc.c, pc.out, -1); err != nil {
		return nil, staleOr(c.ioError(err))
	}
	p, fds, err := recvPacket(pc.c, pc.buf, pc.oob)
	if err != nil {
		return nil, staleOr(c.ioError(err))
	}
	list, err := parseAnnounce(p, len(fds))
	if err != nil {
		closeAll(fds)
		return nil, err
	}
	var held []*slabMap
	left := budget
	for i, a := range list {
		if c.onFD != nil {
			c.onFD(fds[i])
		}
		if a.size > left {
			// The owner ignored our budget: map no more than it.
			unix.Close(fds[i])
			err = errors.Join(err, fmt.Errorf("%w: owner announced a slab of %d bytes past the %d-byte budget", fabric.ErrBadRequest, a.size, budget))
			continue
		}
		left -= a.size
		err = errors.Join(err, c.slabs.adopt(pc, slabKey{owner: pc.owner, id: a.mapID}, fds[i], a.size))
		unix.Close(fds[i])
		if m := c.slabs.hold(pc, a.mapID); m != nil {
			held = append(held, m)
		}
	}
	c.slabs.count(func(s *slabs) { s.announced += int64(len(list)) })
	if err != nil {
		for _, m := range held {
			c.slabs.release(m)
		}
		return nil, fmt.Errorf("shm: map announced slabs: %w", err)
	}
	return held, nil
}

// holds reports whether pc received a slab: its owner serves slab memory.
func (s *slabs) holds(pc *pconn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(pc.slabs) > 0
}

// hold returns the slab pc received under id with a reference held, or
// nil.
func (s *slabs) hold(pc *pconn, id uint64) *slabMap {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := pc.slabs[id]
	if m != nil {
		m.refs++
	}
	return m
}

// holdOwner adds to held the other slabs of owner mapped now, each with
// a reference held.
func (s *slabs) holdOwner(owner string, held []*slabMap) []*slabMap {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, m := range s.byKey {
		if k.owner == owner && !slices.Contains(held, m) {
			m.refs++
			held = append(held, m)
		}
	}
	return held
}

// count updates the counters under s.mu.
func (s *slabs) count(f func(*slabs)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

// populateAll builds the page tables of every chunk of m that no read has
// claimed yet, one chunk at a time (a read that needs a chunk meanwhile
// populates it itself, or faults it in), and returns the bytes it
// populated. Before each chunk it waits until idle has no transfer in
// flight. It stops when ctx ends.
func (m *slabMap) populateAll(ctx context.Context, idle *idleGate) (int64, error) {
	var done int64
	for c := int64(0); c*popChunk < int64(len(m.data)); c++ {
		if err := idle.wait(ctx); err != nil {
			return done, err
		}
		w, bit := c/64, uint64(1)<<(c%64)
		m.pmu.Lock()
		claimed := m.populated[w]&bit != 0
		m.populated[w] |= bit
		m.pmu.Unlock()
		if claimed {
			continue
		}
		end := min((c+1)*popChunk, int64(len(m.data)))
		_ = unix.Madvise(m.data[c*popChunk:end], unix.MADV_POPULATE_READ)
		done += end - c*popChunk
	}
	return done, nil
}
