package shm

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Zero-copy views: a reader on the owner's host maps the owner's object
// read-only and uses it in place, the analogue of opening a CUDA IPC
// handle. The owner validates the claim and grants a read-only descriptor
// of the object's allocation alone (tensor.Exportable); the reader maps it
// without populating the page tables, so a view costs the same whatever
// the object's size, and copies nothing. The owner does not pin the object
// for the life of the view (the caller's lease keeps it alive); what keeps
// the view safe after a Free is that exported memory is never recycled: a
// view outliving its object shows the freed object's bytes, never another
// allocation's, until it is released.

var _ fabric.Viewer = (*Transport)(nil)

// View maps src's bytes of the owner's object read-only into this process
// and returns them as a host-visible buffer (writing to it faults). Release
// unmaps it (once no cached transfer uses the mapping either).
func (t *Transport) View(ctx context.Context, src fabric.Remote) (tensor.Buffer, error) {
	if t.closed.Load() {
		return nil, fabric.ErrClosed
	}
	return t.c.view(ctx, t.name, src)
}

func (c *Client) view(ctx context.Context, name string, src fabric.Remote) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if src.Length <= 0 {
		return nil, fmt.Errorf("%w: a view of %d bytes", fabric.ErrBadRequest, src.Length)
	}
	want, addr, err := c.target(name, src)
	if err != nil {
		return nil, err
	}
	owner := ownerKey(want, addr)
	key := cacheKey{owner: owner, object: src.Claim.Object, incarnation: src.Claim.Incarnation}
	c.idle.enter() // the slab prefetch waits (prefetch.go)
	defer c.idle.leave()
	var m *mapping
	var sv *slabView
	err = c.withConn(ctx, want, owner, addr, func(pc *pconn) error {
		var err error
		m, sv, err = c.viewOn(pc, key, src)
		return err
	})
	if err != nil {
		if sv != nil {
			sv.Release() // made, then the exchange was cancelled
		}
		return nil, err
	}
	if sv != nil {
		sv.dev = src.Endpoint.Device
		return sv, nil
	}
	return &viewBuffer{c: c, m: m, off: src.Offset, n: src.Length, dev: src.Endpoint.Device}, nil
}

// viewOn asks the owner to grant src's claim on pc and returns the object's
// mapping with a reference held for the view: the cached one when the
// grant names it, else a new lazy read-only mapping.
func (c *Client) viewOn(pc *pconn, key cacheKey, r fabric.Remote) (*mapping, *slabView, error) {
	held := c.cache.acquire(key)
	ok := false
	defer func() {
		if !ok && held != nil {
			c.cache.release(held)
		}
	}()
	req := request{op: opView, claim: r.Claim, offset: r.Offset, length: r.Length}
	if held != nil {
		req.have = held.id
	}
	g, fds, err := c.exchangeRequest(pc, req)
	if err != nil {
		c.refused(key, err)
		return nil, nil, err
	}
	if g.flags&flagSlab != 0 {
		sv, err := c.slabViewOn(pc, g, fds, r)
		return nil, sv, err
	}
	if g.hold != 0 {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: a hold on a view of per-object memory", fabric.ErrCorrupt)
	}
	// A view's private copy starts at viewOff in the object (see
	// tensor.ViewShare): the grant holds [viewOff, viewOff+objLen).
	if r.Offset < g.viewOff || r.Offset+r.Length > g.viewOff+g.objLen {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: grant of the object's bytes [%d,+%d) does not hold [%d,+%d)", fabric.ErrCorrupt, g.viewOff, g.objLen, r.Offset, r.Length)
	}
	if len(fds) == 1 {
		data, base, err := mapRegionFlags(fds[0], g.objOff, g.objLen, false, 0)
		unix.Close(fds[0])
		if err != nil {
			return nil, nil, err
		}
		m := &mapping{key: key, id: g.mapID, objOff: g.objOff, objLen: g.objLen, viewOff: g.viewOff, base: base, data: data, refs: 1}
		c.cache.insert(m)
		if held != nil {
			c.cache.release(held)
		}
		held = m
	} else if held == nil || held.id != g.mapID || held.objOff != g.objOff || held.objLen != g.objLen || held.viewOff != g.viewOff {
		return nil, nil, fmt.Errorf("%w: owner granted mapping %#x without a descriptor, which we do not hold", fabric.ErrCorrupt, g.mapID)
	} else {
		c.cache.hit(key)
	}
	// The owner pinned the object for this exchange only: done unpins it.
	if err := c.confirm(pc); err != nil {
		return nil, nil, err
	}
	ok = true
	return held, nil, nil
}

// viewBuffer is a view: the object's bytes in a read-only mapping.
type viewBuffer struct {
	c      *Client
	m      *mapping
	off, n int64
	dev    tensor.DeviceID
	mu     sync.Mutex
	done   bool
}

func (v *viewBuffer) Device() tensor.DeviceID { return v.dev }
func (v *viewBuffer) Len() int64              { return v.n }

// Bytes returns the object's bytes, read-only (a write faults); nil after
// Release.
func (v *viewBuffer) Bytes() []byte {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.done {
		return nil
	}
	return v.m.bytes()[v.off-v.m.viewOff : v.off-v.m.viewOff+v.n]
}

// Release drops the view's reference on the mapping. Idempotent.
func (v *viewBuffer) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.done {
		v.done = true
		v.c.cache.release(v.m)
	}
	return nil
}
