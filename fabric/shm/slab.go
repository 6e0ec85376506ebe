package shm

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Slab grants. An owner whose memory is a tensor.SlabMemory (opt-in, one
// trust scope) shares each object as its place in a large slab file
// (Handle.Slab). The grant then carries flagSlab, and its mapping id names
// the slab, not the object. The owner passes a slab's descriptor once per
// connection: it remembers, per connection, the slabs it sent, and later
// grants of objects in them carry only the offset and length. The reader
// maps each slab once, read-only, keeps the mapping for as long as a
// connection that received it is open (and while a copy uses it), and
// shares it among its connections to that owner, so the second and later
// objects cost no mmap and, once their pages were touched, no page faults.
//
// Slab grants go only to readers in the owner's trust scope: the owner
// grants one only when it requires the cluster key, which every reader
// proved in the handshake (and its AllowPeer passed them). An owner
// without a cluster key refuses slab objects; the reader takes another
// path, loudly.
//
// A freed range of a slab is reused for the owner's next object. Copies
// are safe (the owner pins the object for the whole copy); views hold
// their range (below).

// errNoScope is the owner's refusal of a slab object without a trust scope.
var errNoScope = errors.New("shm: slab memory is shared only within a trust scope (a cluster key), and this owner requires none")

// slabKey names one slab of one owner (its socket and peer).
type slabKey struct {
	owner string
	id    uint64
}

// slabMap is one slab of an owner's, mapped read-only.
type slabMap struct {
	key  slabKey
	data []byte
	refs int // connections that received it, and copies using it
	// populated marks the popChunk-sized chunks whose page tables this
	// mapping has (guarded by pmu): the owner never gives a slab's
	// pages back while it lives, so they stay, and a populate call walks
	// the page tables even when nothing is missing.
	populated []uint64
	pmu       sync.Mutex
}

const popChunk = 2 << 20

// slabs holds the slab mappings of every owner and which connection holds
// which.
type slabs struct {
	mu     sync.Mutex
	byKey  map[slabKey]*slabMap
	bytes  int64
	mapped int64 // descriptors mapped (one mmap each)
	reused int64 // descriptors received for a slab already mapped (no mmap)
	hits   int64 // grants served by a slab the connection holds
	unmaps int64
	// prefetch.go
	announced    int64 // slab descriptors received by announcement
	pfBytes      int64 // bytes whose page tables prefetch built
	pfDone       int64 // prefetches finished
	pfOverBudget int64 // prefetches skipped: the budget was full
	prefetching  atomic.Int64
}

// SlabStats counts the reader's slab mappings.
type SlabStats struct {
	Live     int   // slabs mapped now
	Bytes    int64 // bytes of slabs mapped now
	Mapped   int64 // slab descriptors mapped (each one mmap)
	Reused   int64 // slab descriptors received while already mapped (no mmap)
	Hits     int64 // slab grants that needed no descriptor
	Unmapped int64
	// Prefetch (prefetch.go): slabs announced ahead of any read,
	// bytes whose page tables were built in the background, prefetches
	// finished, skipped (budget full), and in flight now.
	Announced       int64
	PrefetchedBytes int64
	Prefetches      int64
	OverBudget      int64
	Prefetching     int64
}

func (s *slabs) snapshot() SlabStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SlabStats{Live: len(s.byKey), Bytes: s.bytes, Mapped: s.mapped, Reused: s.reused, Hits: s.hits, Unmapped: s.unmaps,
		Announced: s.announced, PrefetchedBytes: s.pfBytes, Prefetches: s.pfDone, OverBudget: s.pfOverBudget, Prefetching: s.prefetching.Load()}
}

// forGrant returns the slab a slab grant on pc names, with a reference held
// for the caller's copy. A descriptor that came with the grant is adopted
// first, whatever else fails: the owner will not send it again on pc.
func (s *slabs) forGrant(pc *pconn, g grant, fds []int) (*slabMap, error) {
	if len(fds) == 1 {
		err := s.adopt(pc, slabKey{owner: pc.owner, id: g.mapID}, fds[0], g.fileSize)
		unix.Close(fds[0])
		if err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := pc.slabs[g.mapID]
	switch {
	case m == nil:
		return nil, fmt.Errorf("%w: owner named slab %#x without its descriptor, which this connection never received", fabric.ErrCorrupt, g.mapID)
	case int64(len(m.data)) != g.fileSize:
		return nil, fmt.Errorf("%w: slab %#x is %d bytes, the grant says %d", fabric.ErrCorrupt, g.mapID, len(m.data), g.fileSize)
	}
	if len(fds) == 0 {
		s.hits++
	}
	m.refs++
	return m, nil
}

// adopt records that pc received key's descriptor: it maps the slab
// unless another connection did already, and pc holds a reference.
func (s *slabs) adopt(pc *pconn, key slabKey, fd int, size int64) error {
	s.mu.Lock()
	m := s.byKey[key]
	if m != nil {
		if pc.slabs[key.id] == nil {
			m.refs++
			pc.slabs[key.id] = m
		}
		s.reused++
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	// Not populated: the copies populate the object's pages they read,
	// and the rest of the slab may never be read here.
	data, _, err := mapRegionFlags(fd, 0, size, false, 0)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m = s.byKey[key]; m != nil { // another connection mapped it meanwhile
		unix.Munmap(data)
		s.reused++
	} else {
		m = &slabMap{key: key, data: data, populated: make([]uint64, (int64(len(data))+popChunk*64-1)/(popChunk*64))}
		if s.byKey == nil {
			s.byKey = map[slabKey]*slabMap{}
		}
		s.byKey[key] = m
		s.bytes += int64(len(data))
		s.mapped++
	}
	if old := pc.slabs[key.id]; old != m {
		if old != nil {
			s.releaseLocked(old)
		}
		m.refs++
		pc.slabs[key.id] = m
	}
	return nil
}

func (s *slabs) release(m *slabMap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(m)
}

func (s *slabs) releaseLocked(m *slabMap) {
	m.refs--
	if m.refs > 0 {
		return
	}
	unix.Munmap(m.data)
	s.bytes -= int64(len(m.data))
	m.data = nil
	delete(s.byKey, m.key)
	s.unmaps++
}

// dropConn releases the slabs pc holds: the connection is closed, so the
// owner's record of what it sent on it is gone too. Idempotent.
func (s *slabs) dropConn(pc *pconn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, m := range pc.slabs {
		delete(pc.slabs, id)
		s.releaseLocked(m)
	}
}

// object returns the bytes [off, off+n) of the slab file, with their page
// tables built when there are many of them (MADV_POPULATE_READ): a copy
// that faults a page at a time costs more than the copy on a VM. Pages a
// previous read populated cost nothing more.
func (m *slabMap) object(off, n int64) []byte {
	p := m.data[off : off+n]
	if n < 1<<20 {
		return p
	}
	first, last := off/popChunk, (off+n-1)/popChunk
	start, end := int64(-1), int64(0)
	m.pmu.Lock()
	for c := first; c <= last; c++ {
		w, bit := c/64, uint64(1)<<(c%64)
		if m.populated[w]&bit == 0 {
			m.populated[w] |= bit
			if start < 0 {
				start = c * popChunk
			}
			end = min((c+1)*popChunk, int64(len(m.data)))
		}
	}
	m.pmu.Unlock()
	if start >= 0 {
		populateRead(m.data[start:end])
	}
	return p
}

// maxHolds bounds the views one reader may hold on an owner's slab ranges.
const maxHolds = 1 << 16

// errTooManyHolds refuses a view beyond maxHolds; the reader copies.
var errTooManyHolds = fmt.Errorf("%w: this reader holds %d views of the owner's slab objects already", fabric.ErrBadRequest, maxHolds)

// viewHolds is the owner's record of readers' views of slab objects: per
// reader, its open connections and its holds (each keeps one object's
// range from reuse). The reader releases a hold with an unview on any of
// its connections; when its last connection closes (it exited, or closed
// its client), every hold it had goes.
type viewHolds struct {
	mu     sync.Mutex
	peers  map[peer.ID]*peerHolds
	serial uint64
}

type peerHolds struct {
	conns int
	holds map[uint64]func()
	// pending are hold ids granted whose done has not been read yet; true
	// once an unview for it came first (on another connection, the done
	// and the unview race), so add releases it at once.
	pending map[uint64]bool
}

func (v *viewHolds) connect(p peer.ID) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.peers == nil {
		v.peers = map[peer.ID]*peerHolds{}
	}
	ph := v.peers[p]
	if ph == nil {
		ph = &peerHolds{holds: map[uint64]func(){}, pending: map[uint64]bool{}}
		v.peers[p] = ph
	}
	ph.conns++
}

func (v *viewHolds) disconnect(p peer.ID) {
	v.mu.Lock()
	ph := v.peers[p]
	ph.conns--
	var drop map[uint64]func()
	if ph.conns == 0 {
		drop = ph.holds
		delete(v.peers, p)
	}
	v.mu.Unlock()
	for _, release := range drop {
		release()
	}
}

// holding reports whether p holds views (its connections are then not
// closed for idleness).
func (v *viewHolds) holding(p peer.ID) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	ph := v.peers[p]
	return ph != nil && len(ph.holds) > 0
}

// next returns a fresh hold id for p (pending until add or abandon), or
// errTooManyHolds.
func (v *viewHolds) next(p peer.ID) (uint64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	ph := v.peers[p]
	if ph == nil || len(ph.holds)+len(ph.pending) >= maxHolds {
		return 0, errTooManyHolds
	}
	v.serial++
	ph.pending[v.serial] = false
	return v.serial, nil
}

// add records a confirmed view's hold, or releases it at once when its
// unview came first or the peer is gone.
func (v *viewHolds) add(p peer.ID, id uint64, release func()) {
	v.mu.Lock()
	ph := v.peers[p]
	keep := ph != nil && !ph.pending[id]
	if ph != nil {
		delete(ph.pending, id)
		if keep {
			ph.holds[id] = release
		}
	}
	v.mu.Unlock()
	if !keep {
		release()
	}
}

// abandon forgets a pending id whose view was never confirmed.
func (v *viewHolds) abandon(p peer.ID, id uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ph := v.peers[p]; ph != nil {
		delete(ph.pending, id)
	}
}

// release drops p's hold id (an unview). One still pending is released
// when it is added; unknown ids are ignored.
func (v *viewHolds) release(p peer.ID, id uint64) {
	v.mu.Lock()
	var release func()
	if ph := v.peers[p]; ph != nil {
		if _, ok := ph.pending[id]; ok {
			ph.pending[id] = true
		} else {
			release = ph.holds[id]
			delete(ph.holds, id)
		}
	}
	v.mu.Unlock()
	if release != nil {
		release()
	}
}

// count returns the holds p has (for tests).
func (v *viewHolds) count(p peer.ID) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ph := v.peers[p]; ph != nil {
		return len(ph.holds)
	}
	return 0
}

// Views of slab objects. The reader asks with opView; the owner holds the
// object's range against reuse until the reader's unview (or until the
// reader has no connection left), so the view stays the object's bytes
// even after the owner frees it, as a per-object view does. The first view
// of an owner's makes the connection it came on the reader's anchor to
// that owner: kept open, never used for transfers (so no cancelled
// transfer closes it), it carries the unviews, and while it is open the
// owner keeps the holds.

// slabView is a view of an object in an owner's slab.
type slabView struct {
	c      *Client
	m      *slabMap
	owner  string
	hold   uint64
	off, n int64 // the object's bytes in the slab file
	dev    tensor.DeviceID
	mu     sync.Mutex
	done   bool
}

func (v *slabView) Device() tensor.DeviceID { return v.dev }
func (v *slabView) Len() int64              { return v.n }

// Bytes returns the object's bytes, read-only (a write faults); nil after
// Release.
func (v *slabView) Bytes() []byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.done {
		return nil
	}
	return v.m.data[v.off : v.off+v.n : v.off+v.n]
}

// Release gives the owner its range back (unview) and drops the view's
// reference on the slab mapping. Idempotent.
func (v *slabView) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.done {
		v.done = true
		v.c.unview(v.owner, v.hold)
		v.c.slabs.release(v.m)
	}
	return nil
}

// slabViewOn completes a view exchange whose grant is a slab's: the view
// holds a reference on the slab mapping, and pc becomes the anchor to the
// owner if there is none.
func (c *Client) slabViewOn(pc *pconn, g grant, fds []int, r fabric.Remote) (*slabView, error) {
	if len(fds) == 1 && c.onFD != nil {
		c.onFD(fds[0])
	}
	m, err := c.slabs.forGrant(pc, g, fds)
	if err != nil {
		return nil, err
	}
	if g.hold == 0 || r.Length <= 0 || r.Offset < g.viewOff || r.Offset+r.Length > g.viewOff+g.objLen {
		c.slabs.release(m)
		return nil, fmt.Errorf("%w: view grant of [%d,+%d) (hold %d) does not hold [%d,+%d)", fabric.ErrCorrupt, g.viewOff, g.objLen, g.hold, r.Offset, r.Length)
	}
	if err := c.confirm(pc); err != nil {
		c.slabs.release(m)
		if errors.Is(err, errConfirmedLost) {
			// The done did not go out: the owner holds nothing for us.
			return nil, fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
		}
		return nil, err
	}
	pc.anchor = true
	off := g.objOff + r.Offset - g.viewOff
	m.object(off, r.Length) // page tables built once per chunk for the mapping's life
	return &slabView{c: c, m: m, owner: pc.owner, hold: g.hold, off: off, n: r.Length}, nil
}

// unview releases a view's hold, on the owner's anchor. Without one (it
// failed) the owner drops the hold with our last connection.
func (c *Client) unview(owner string, id uint64) {
	c.anchorMu.Lock()
	a := c.anchors[owner]
	if a == nil {
		// The anchor died since the view was made: the next one carries
		// it (until then the owner keeps the hold, at worst until our
		// last connection to it closes).
		c.unviewQ[owner] = append(c.unviewQ[owner], id)
		c.anchorMu.Unlock()
		return
	}
	c.anchorMu.Unlock()
	c.sendUnview(a, owner, id)
}

// sendUnview sends one unview on the anchor a, and drops a if it fails.
func (c *Client) sendUnview(a *pconn, owner string, id uint64) {
	a.wmu.Lock()
	a.c.SetWriteDeadline(time.Now().Add(c.cfg.StallTimeout))
	err := sendPacket(a.c, unviewPacket(id), -1)
	a.wmu.Unlock()
	if err != nil {
		c.cfg.Logger.Debug("shm: unview failed, dropping the anchor connection", "owner", owner, "err", err)
		c.anchorMu.Lock()
		drop := c.anchors[owner] == a
		if drop {
			delete(c.anchors, owner)
		}
		c.anchorMu.Unlock()
		if drop {
			c.pool.Discard(a)
		}
	}
}

// keepAnchor makes pc, which carried a slab view, the owner's anchor
// unless a live one exists, and reports whether it did (pc then stays out
// of the pool's rotation, keeping its slot).
func (c *Client) keepAnchor(pc *pconn) bool {
	pc.anchor = false
	c.anchorMu.Lock()
	a := c.anchors[pc.owner]
	if a != nil && peerOpen(a.c) == nil {
		c.anchorMu.Unlock()
		return false
	}
	c.anchors[pc.owner] = pc
	queued := c.unviewQ[pc.owner]
	delete(c.unviewQ, pc.owner)
	c.anchorMu.Unlock()
	if a != nil {
		c.pool.Discard(a) // the owner closed it: its holds went with it
	}
	for _, id := range queued {
		c.sendUnview(pc, pc.owner, id)
	}
	return true
}

// populateRead builds p's page tables (MADV_POPULATE_READ), on several
// cores when p is large: the page-table locks are per table page, so
// populating halves in parallel takes about half the time.
func populateRead(p []byte) {
	const part = 16 << 20
	workers := min(runtime.GOMAXPROCS(0), 4, (len(p)+part-1)/part)
	if workers < 2 {
		_ = unix.Madvise(p, unix.MADV_POPULATE_READ)
		return
	}
	per := (len(p)/workers + int(pageSize) - 1) &^ (int(pageSize) - 1)
	var wg sync.WaitGroup
	for off := 0; off < len(p); off += per {
		wg.Go(func() { _ = unix.Madvise(p[off:min(off+per, len(p))], unix.MADV_POPULATE_READ) })
	}
	wg.Wait()
}
