package shm

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/pcopy"
	"github.com/tensorlane/tensorlane/tensor"
)

var pageSize = int64(os.Getpagesize())

// mapRegion maps [off, off+n) of the allocation file behind fd, widened to
// whole pages: only the object's pages (the file may be a larger
// allocation the object is a view of).
// MAP_POPULATE builds the page tables at once, so the first copy does not
// take one fault per 4 KiB page. It checks that the file really holds the
// range: touching a mapping beyond the end of its file raises SIGBUS.
func mapRegion(fd int, off, n int64, writable bool) (data []byte, base int64, err error) {
	return mapRegionFlags(fd, off, n, writable, unix.MAP_POPULATE)
}

// mapRegionFlags is mapRegion with extra mmap flags (views map lazily:
// populating the page tables costs time in proportion to the size).
func mapRegionFlags(fd int, off, n int64, writable bool, flags int) (data []byte, base int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, fmt.Errorf("%w: stat received descriptor: %v", fabric.ErrCorrupt, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, 0, fmt.Errorf("%w: received descriptor is not a memory file (mode %#o)", fabric.ErrCorrupt, st.Mode)
	}
	if off < 0 || n <= 0 || off+n > st.Size {
		return nil, 0, fmt.Errorf("%w: range [%d,+%d) beyond the %d-byte allocation file", fabric.ErrCorrupt, off, n, st.Size)
	}
	// The size checked above must hold for as long as the mapping lives:
	// a file its owner can still shrink would fault (SIGBUS) a reader
	// that touches the mapping afterwards, in a view outside any guarded
	// copy. Our owners seal their files' size (tensor's segments); a
	// descriptor without F_SEAL_SHRINK comes from a peer that could
	// truncate it, and is refused before it is mapped.
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return nil, 0, fmt.Errorf("%w: received descriptor is not sealed against shrinking (seals %#x, %v): the owner could truncate it under the mapping", fabric.ErrCorrupt, seals, err)
	}
	base = off &^ (pageSize - 1)
	end := (off + n + pageSize - 1) &^ (pageSize - 1)
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	data, err = unix.Mmap(fd, base, int(end-base), prot, unix.MAP_SHARED|flags)
	if err != nil {
		return nil, 0, fmt.Errorf("shm: map %d bytes of the owner's allocation: %w", end-base, err)
	}
	tensor.AdviseHuge(data) // map the owner's huge pages as such, where it has them
	return data, base, nil
}

// guardedCopy copies from into to in chunks, checking ctx between them,
// and check too when it is not nil. The shared file can shrink under us (a
// peer that truncates it: our own owners seal their files against that,
// but a client must not trust a peer's); the resulting SIGBUS becomes an error
// instead of killing the process.
func guardedCopy(ctx context.Context, to, from []byte, chunk int, check func() error) error {
	// Large copies run on several cores (internal/pcopy), each guarded.
	err := pcopy.Copy(ctx, to, from, pcopy.Options{Chunk: chunk, Check: check, GuardFaults: true})
	if fe, ok := errors.AsType[*pcopy.FaultError](err); ok {
		return fmt.Errorf("%w: shared memory fault during copy (the peer shrank the file?): %v", fabric.ErrCorrupt, fe.Cause)
	}
	return err
}

// guardedGather is guardedCopy of the concatenation of runs of from.
func guardedGather(ctx context.Context, to, from []byte, runs []pcopy.Run, chunk int, check func() error) error {
	err := pcopy.Gather(ctx, to, from, runs, pcopy.Options{Chunk: chunk, Check: check, GuardFaults: true})
	if fe, ok := errors.AsType[*pcopy.FaultError](err); ok {
		return fmt.Errorf("%w: shared memory fault during copy (the peer shrank the file?): %v", fabric.ErrCorrupt, fe.Cause)
	}
	return err
}

// cacheKey names one claim's mapping: the owner (peer and socket), the
// object and the owner incarnation that issued the claim, and whether it
// is a push mapping (the sink's pages, writable) or a read mapping (the
// object's pages, read-only). The two never share a mapping: a read never
// gets write access through the cache, and a push never reuses a read-only
// mapping it could not write through.
type cacheKey struct {
	owner       string
	object      fabric.ObjectID
	incarnation uint64
	push        bool
}

// dir is the index of a key's direction in the per-direction counters.
func (k cacheKey) dir() int {
	if k.push {
		return dirPush
	}
	return dirPull
}

const (
	dirPull = iota
	dirPush
)

// mapping is one object's pages of an owner's allocation: read-only for reads,
// writable (a sink's own pages only) for pushes.
type mapping struct {
	key     cacheKey
	id      uint64 // the owner's mapping id
	objOff  int64  // file offset of the first granted byte
	objLen  int64
	viewOff int64 // the object byte at objOff (the view's start in a copy of a view)
	base    int64 // file offset of data[0]
	data    []byte
	// dev is an imported device allocation (tensor/cuda) instead of a
	// mapping of a memory file; devSize is the bytes it maps.
	dev     tensor.Buffer
	devSize int64

	refs int  // readers copying from it, and the cache's own reference
	gone bool // no longer in the cache: unmapped when refs drops to 0
	elem *list.Element
}

// size is the address space the mapping takes.
func (m *mapping) size() int64 {
	if m.dev != nil {
		return m.devSize
	}
	return int64(len(m.data))
}

// bytes returns the granted bytes in the mapping: object bytes
// [viewOff, viewOff+objLen).
func (m *mapping) bytes() []byte {
	start := m.objOff - m.base
	return m.data[start : start+m.objLen]
}

// cache holds mappings per claim so repeated reads do not re-map. It never
// decides whether a mapping's bytes are valid: every read re-validates its
// claim with the owner, who pins the object for the copy.
type cache struct {
	maxN     int
	maxBytes int64

	mu     sync.Mutex
	byKey  map[cacheKey]*mapping
	lru    *list.List // front: most recently used
	bytes  int64
	events [2]CacheEvents // by direction: dirPull, dirPush
	stats  CacheStats
}

// CacheEvents counts what the mapping cache did for one direction
// (reads, or pushes).
type CacheEvents struct {
	Mapped  int64 // misses: descriptors received and mapped
	Hits    int64 // transfers served from an existing mapping
	Revoked int64 // mappings dropped because the owner refused the claim (freed, unknown, stale)
	Evicted int64 // mappings dropped to stay within the limits
	Purged  int64 // mappings dropped because their owner went away
}

// CacheStats counts what the mapping cache did. The embedded events are
// the totals of both directions; Pull and Push split them.
type CacheStats struct {
	CacheEvents
	Pull, Push CacheEvents
	Live       int   // mappings now cached
	Bytes      int64 // bytes now mapped by the cache
	Unmapped   int64 // mappings unmapped (the last user released them)
}

func newCache(maxN int, maxBytes int64) *cache {
	return &cache{maxN: maxN, maxBytes: maxBytes, byKey: map[cacheKey]*mapping{}, lru: list.New()}
}

// acquire returns the cached mapping for key with a reference held, or nil.
func (c *cache) acquire(key cacheKey) *mapping {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.byKey[key]
	if m == nil {
		return nil
	}
	m.refs++
	c.lru.MoveToFront(m.elem)
	return m
}

// insert caches m (whose caller holds one reference), replacing any older
// mapping of its key, and evicts unused mappings beyond the limits.
func (c *cache) insert(m *mapping) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events[m.key.dir()].Mapped++
	if old := c.byKey[m.key]; old != nil {
		c.removeLocked(old)
	}
	m.refs++ // the cache's reference
	m.elem = c.lru.PushFront(m)
	c.byKey[m.key] = m
	c.bytes += m.size()
	for e := c.lru.Back(); e != nil && (c.lru.Len() > c.maxN || c.bytes > c.maxBytes); {
		prev := e.Prev()
		if v := e.Value.(*mapping); v != m {
			c.removeLocked(v)
			c.events[v.key.dir()].Evicted++
		}
		e = prev
	}
}

func (c *cache) removeLocked(m *mapping) {
	if m.gone {
		return
	}
	m.gone = true
	c.lru.Remove(m.elem)
	delete(c.byKey, m.key)
	c.bytes -= m.size()
	c.releaseLocked(m)
}

func (c *cache) release(m *mapping) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.releaseLocked(m)
}

func (c *cache) releaseLocked(m *mapping) {
	m.refs--
	if m.refs == 0 && m.gone && m.data != nil {
		unix.Munmap(m.data)
		m.data = nil
		c.stats.Unmapped++
	}
	if m.refs == 0 && m.gone && m.dev != nil {
		m.dev.Release()
		m.dev = nil
		c.stats.Unmapped++
	}
}

// revoke drops key's mapping: the owner refused the claim.
func (c *cache) revoke(key cacheKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.byKey[key]; m != nil {
		c.removeLocked(m)
		c.events[key.dir()].Revoked++
	}
}

// revokeIncarnation drops every mapping of owner's incarnation: the owner
// said a claim of it is stale (it restarted or reset its objects), so no
// claim of that incarnation will be granted again.
func (c *cache) revokeIncarnation(owner string, incarnation uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, m := range c.byKey {
		if k.owner == owner && k.incarnation == incarnation {
			c.removeLocked(m)
			c.events[k.dir()].Revoked++
		}
	}
}

// purge drops every mapping of owner: it went away, and its memory stays
// alive (memory the host cannot reclaim) for as long as we map it.
func (c *cache) purge(owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, m := range c.byKey {
		if k.owner == owner {
			c.removeLocked(m)
			c.events[k.dir()].Purged++
		}
	}
}

// clear drops everything; mappings in use are unmapped by their last user.
func (c *cache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.byKey {
		c.removeLocked(m)
	}
}

func (c *cache) hit(key cacheKey) {
	c.mu.Lock()
	c.events[key.dir()].Hits++
	c.mu.Unlock()
}

func (c *cache) snapshot() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Pull, s.Push = c.events[dirPull], c.events[dirPush]
	s.CacheEvents = CacheEvents{
		Mapped:  s.Pull.Mapped + s.Push.Mapped,
		Hits:    s.Pull.Hits + s.Push.Hits,
		Revoked: s.Pull.Revoked + s.Push.Revoked,
		Evicted: s.Pull.Evicted + s.Push.Evicted,
		Purged:  s.Pull.Purged + s.Push.Purged,
	}
	s.Live, s.Bytes = c.lru.Len(), c.bytes
	return s
}
