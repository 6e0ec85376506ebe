package shm

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
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
// proved in the handshake (and its Authorize passed them). An owner
// without a cluster key refuses slab objects; the reader takes another
// path, loudly.
//
// Views of slab objects are refused (ErrSlabView): a freed range of a slab
// is reused for the owner's next object, so a view that outlived its
// object would show another object's bytes. Copies are safe: the owner
// pins the object for the whole copy.

// ErrSlabView is returned by View for an object that lives in a slab; read
// it with a copying Read instead.
var ErrSlabView = fmt.Errorf("%w: the object lives in a slab shared within its trust scope, whose ranges are reused: views need per-object memory, copy it instead", fabric.ErrBadRequest)

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
}

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
}

// SlabStats counts the reader's slab mappings.
type SlabStats struct {
	Live     int   // slabs mapped now
	Bytes    int64 // bytes of slabs mapped now
	Mapped   int64 // slab descriptors mapped (each one mmap)
	Reused   int64 // slab descriptors received while already mapped (no mmap)
	Hits     int64 // slab grants that needed no descriptor
	Unmapped int64
}

func (s *slabs) snapshot() SlabStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SlabStats{Live: len(s.byKey), Bytes: s.bytes, Mapped: s.mapped, Reused: s.reused, Hits: s.hits, Unmapped: s.unmaps}
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
		m = &slabMap{key: key, data: data}
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
	if n >= 1<<20 {
		start := off &^ (pageSize - 1)
		end := min((off+n+pageSize-1)&^(pageSize-1), int64(len(m.data)))
		_ = unix.Madvise(m.data[start:end], unix.MADV_POPULATE_READ)
	}
	return p
}
