//go:build ofi

package ofi

/*
#include "cfi.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// mr is one registration. Its memory is pinned (runtime.Pinner: Go
// memory must not move while libfabric holds its address; a no-op for
// mmap'd device arenas) until Deregister.
type mr struct {
	dev        *device
	cmr        *C.struct_fid_mr
	desc       unsafe.Pointer // fi_mr_desc: C memory
	base       uintptr
	n          int
	lkey, rkey uint32
	addr       uint64
	remote     bool // a target registration: remote peers access it
	pin        runtime.Pinner

	mu       sync.Mutex
	inflight map[*op]struct{} // local operations posted on it, not completed
	idle     *sync.Cond
	dereg    bool
}

// dereqWait bounds how long Deregister waits for local operations still
// in flight on a region before it breaks their queue pairs (which stops
// them: an endpoint's close ends its transfers).
const deregWait = 2 * time.Second

func (p *pd) RegisterMemory(buf []byte, access rdma.Access) (rdma.MemoryRegion, error) {
	d := p.dev
	m := &mr{dev: d, n: len(buf), remote: access&(rdma.AccessRemoteRead|rdma.AccessRemoteWrite) != 0,
		inflight: map[*op]struct{}{}}
	m.idle = sync.NewCond(&m.mu)
	if len(buf) > 0 {
		m.pin.Pin(&buf[0])
		m.base = uintptr(unsafe.Pointer(&buf[0]))
	}
	var acc C.uint64_t
	if access&rdma.AccessLocalWrite != 0 {
		acc |= C.FI_READ | C.FI_WRITE
	}
	if access&rdma.AccessRemoteRead != 0 {
		acc |= C.FI_REMOTE_READ
	}
	if access&rdma.AccessRemoteWrite != 0 {
		acc |= C.FI_REMOTE_WRITE
	}
	d.Mu.Lock()
	if d.Closed {
		d.Mu.Unlock()
		m.pin.Unpin()
		return nil, fabric.ErrClosed
	}
	d.nextLKey++
	m.lkey = d.nextLKey
	d.Mu.Unlock()
	if len(buf) > 0 {
		if err := m.register(acc); err != nil {
			m.pin.Unpin()
			return nil, err
		}
	}
	d.Mu.Lock()
	if d.Closed {
		d.Mu.Unlock()
		m.release()
		return nil, fabric.ErrClosed
	}
	d.mrs[m.lkey] = m
	d.Mu.Unlock()
	if m.remote {
		kickOf(d.kick) // the reader's requests follow its resolve
	}
	return m, nil
}

// register calls fi_mr_reg. Where the provider lets us choose keys
// (no FI_MR_PROV_KEY) they are random, so a peer cannot guess another
// transfer's key; remote addresses are virtual addresses under
// FI_MR_VIRT_ADDR and offsets otherwise.
func (m *mr) register(acc C.uint64_t) error {
	d := m.dev
	provKey := d.mrMode&C.FI_MR_PROV_KEY != 0
	for attempt := 0; ; attempt++ {
		var key uint32
		if !provKey {
			var b [4]byte
			rand.Read(b[:])
			key = binary.LittleEndian.Uint32(b[:]) | 1
		}
		d.lockFI()
		rc := C.tl_mr_reg(d.dom, C.uint64_t(m.base), C.size_t(m.n), acc, C.uint64_t(key), &m.cmr)
		d.fiMu.Unlock()
		if rc == -C.FI_ENOKEY && !provKey && attempt < 8 {
			continue // a key in use: draw another
		}
		if rc != 0 {
			return fmt.Errorf("ofi: NIC %s: register %d bytes: %w", d.nic.Name, m.n, fiErr("fi_mr_reg", rc))
		}
		k := uint64(C.tl_mr_key(m.cmr))
		if k > math.MaxUint32 {
			d.lockFI()
			C.tl_mr_close(m.cmr)
			d.fiMu.Unlock()
			return fmt.Errorf("ofi: NIC %s: provider key %#x is wider than 32 bits", d.nic.Name, k)
		}
		m.rkey = uint32(k)
		break
	}
	m.desc = C.tl_mr_desc(m.cmr)
	if d.mrMode&C.FI_MR_VIRT_ADDR != 0 {
		m.addr = uint64(m.base)
	}
	return nil
}

func (m *mr) LKey() uint32 { return m.lkey }
func (m *mr) RKey() uint32 { return m.rkey }
func (m *mr) Addr() uint64 { return m.addr }
func (m *mr) Len() int     { return m.n }

// ptr is the address of the local byte at a (in the Addr space), or
// false when [a, a+n) is not inside the region.
func (m *mr) ptr(a uint64, n uint32) (uintptr, bool) {
	if a < m.addr || a-m.addr > uint64(m.n) || uint64(n) > uint64(m.n)-(a-m.addr) {
		return 0, false
	}
	return m.base + uintptr(a-m.addr), true
}

// Deregister revokes the keys. Local operations still in flight on the
// region are waited for (their completion or their queue pair's timeout),
// then their queue pairs are broken, so nothing writes the memory after
// this returns; a target registration waits for the progress call in
// flight. Idempotent.
func (m *mr) Deregister() error {
	m.mu.Lock()
	if m.dereg {
		m.mu.Unlock()
		return nil
	}
	m.dereg = true
	deadline := time.Now().Add(deregWait)
	for len(m.inflight) > 0 && time.Now().Before(deadline) {
		waitCond(m.idle, time.Until(deadline))
	}
	stuck := map[*qp]bool{}
	for o := range m.inflight {
		stuck[o.qp] = true
	}
	m.mu.Unlock()
	cqs := map[*cq]bool{}
	for q := range stuck {
		cqs[q.cq] = true
	}
	for c := range cqs {
		d := c.dev
		d.Log.Warn("ofi: requests on a deregistered region did not come back; resetting the NIC's completion queue", "nic", d.nic.Name)
		c.reset(false, fmt.Errorf("%w: ofi: a region was deregistered with requests in flight", fabric.ErrClosed))
	}
	d := m.dev
	d.Mu.Lock()
	delete(d.mrs, m.lkey)
	d.Mu.Unlock()
	m.release()
	return nil
}

func (m *mr) release() {
	if m.cmr != nil {
		// No progress call runs meanwhile, so no remote access is being
		// served from the region while its key goes.
		d := m.dev
		d.lockFI()
		C.tl_mr_close(m.cmr)
		d.fiMu.Unlock()
		m.cmr = nil
	}
	m.pin.Unpin()
}

// waitCond waits on c (its lock held) for at most d.
func waitCond(c *sync.Cond, d time.Duration) {
	t := time.AfterFunc(d, func() {
		c.L.Lock()
		c.Broadcast()
		c.L.Unlock()
	})
	c.Wait()
	t.Stop()
}
