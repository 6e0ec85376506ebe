package rdt

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/tensor"
)

// freedMemory bounds how many freed object IDs are remembered so that late
// readers get ErrObjectFreed rather than ErrObjectNotFound.
const freedMemory = 4096

// objectTable holds the objects this runtime owns. It is the fabric.Source
// of every transport: reads pin an object, and the owner's memory returns to
// its allocator only when the object is freed and no read holds a pin.
type objectTable struct {
	incarnation uint64

	mu        sync.Mutex
	objects   map[fabric.ObjectID]*object
	freed     map[fabric.ObjectID]chan struct{} // closed when the memory is back
	freedRing []fabric.ObjectID
	pins      int           // over all objects, for Shutdown to drain reads
	unpinned  chan struct{} // closed and replaced whenever pins drops to 0
	closing   bool          // Shutdown began: no new pins or leases
	onFree    func(id fabric.ObjectID, why string)
	// onStage reports a view staged as a private copy for on-host grants
	// (n bytes copied), or why it could not be (err).
	onStage func(o *object, n int64, err error)
	blocked func(ctx context.Context) error // test hook: a hung owner
	pinned  func(ctx context.Context)       // test hook: runs once a read holds its pin
}

type object struct {
	id   fabric.ObjectID
	buf  tensor.Buffer
	desc tensor.Desc
	// start, end: the published view's byte range in buf (desc.Span());
	// a claim grants these bytes and no others of the parent buffer.
	start, end int64
	layout     layoutSum // digest of desc, which leases must match
	// share hands out the on-host grants (shm, p2p between processes):
	// the allocation itself when the view is all of it, else a private
	// copy of the view staged at the first grant, so no reader is given a
	// descriptor of the rest of the parent allocation.
	share *tensor.ViewShare
	owner string // actor name
	token []byte
	pins  int
	freed bool
	// released: the owner asked to free the object once no reader holds
	// it. holders: reader peers with a lease and when it expires.
	released bool
	holders  map[peer.ID]time.Time
	done     chan struct{} // closed when the memory returned to its device
}

// noExpiry marks a lease held inside this runtime: it lives until released.
var noExpiry = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

var _ fabric.Source = (*objectTable)(nil)

func newObjectTable(incarnation uint64) *objectTable {
	return &objectTable{incarnation: incarnation, objects: map[fabric.ObjectID]*object{}, freed: map[fabric.ObjectID]chan struct{}{},
		unpinned: make(chan struct{}), onFree: func(fabric.ObjectID, string) {}}
}

// add publishes desc's view of buf, which lives in mem (where a private
// copy of the view is staged if an on-host grant needs one).
func (t *objectTable) add(mem tensor.Memory, buf tensor.Buffer, desc tensor.Desc, owner string) *object {
	o := &object{buf: buf, desc: desc, owner: owner, token: make([]byte, 16), holders: map[peer.ID]time.Time{}, done: make(chan struct{}),
		layout: layoutOf(desc)}
	o.start, o.end = desc.Span()
	o.share = tensor.NewViewShare(mem, buf, o.start, o.end)
	rand.Read(o.id[:])
	rand.Read(o.token)
	t.mu.Lock()
	t.objects[o.id] = o
	t.mu.Unlock()
	return o
}

// Open checks the claim, including that its range lies inside the published
// view, and pins the object. It is the one place every data path (local,
// p2p, shm, rdma, tcp) resolves a claim, so the range check holds on all.
func (t *objectTable) Open(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.blocked != nil {
		if err := t.blocked(ctx); err != nil {
			return nil, err
		}
	}
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		return nil, fabric.ErrOwnerClosed
	}
	o, err := t.check(c)
	if err != nil {
		t.mu.Unlock()
		return nil, err
	}
	if c.Offset < o.start || c.Length < 0 || c.Offset > o.end || c.Length > o.end-c.Offset {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: range [%d,+%d) outside the published view [%d,%d) of object %v", fabric.ErrUnauthorized, c.Offset, c.Length, o.start, o.end, o.id)
	}
	o.pins++
	t.pins++
	hook := t.pinned
	t.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
	return &pin{table: t, obj: o}, nil
}

// check resolves a claim to its object; the caller holds t.mu.
func (t *objectTable) check(c fabric.Claim) (*object, error) {
	if c.Incarnation != t.incarnation {
		return nil, ErrStaleRef
	}
	o, ok := t.objects[c.Object]
	if !ok {
		if _, gone := t.freed[c.Object]; gone {
			return nil, ErrObjectFreed
		}
		return nil, ErrObjectNotFound
	}
	if subtle.ConstantTimeCompare(o.token, c.Token) != 1 {
		return nil, ErrUnauthorized
	}
	return o, nil
}

// lease registers or renews who's lease on the claimed object until
// expires, once the claim and the layout the reader was given (a digest of
// the ref's desc) match what the owner published: a reader allocates only
// after this confirmation, so a forged shape costs it nothing.
func (t *objectTable) lease(who peer.ID, c fabric.Claim, layout layoutSum, expires time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return fabric.ErrOwnerClosed
	}
	o, err := t.confirmLocked(c, layout)
	if err != nil {
		return err
	}
	o.holders[who] = expires
	return nil
}

// confirm checks a claim and its layout without leasing: the same check a
// reader in the owner's own runtime needs before it allocates.
func (t *objectTable) confirm(c fabric.Claim, layout layoutSum) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.confirmLocked(c, layout)
	return err
}

func (t *objectTable) confirmLocked(c fabric.Claim, layout layoutSum) (*object, error) {
	o, err := t.check(c)
	if err != nil {
		return nil, err
	}
	if layout != o.layout {
		return nil, fmt.Errorf("%w: object %v", ErrLayoutMismatch, o.id)
	}
	return o, nil
}

// close refuses new pins and leases from now on (Shutdown); reads that hold
// a pin finish. It returns how many do.
func (t *objectTable) close() (inFlight int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	return t.pins
}

// unlease drops who's lease; an object its owner released goes with its
// last lease.
func (t *objectTable) unlease(who peer.ID, c fabric.Claim) error {
	t.mu.Lock()
	o, err := t.check(c)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	delete(o.holders, who)
	if !o.released || len(o.holders) > 0 {
		t.mu.Unlock()
		return nil
	}
	return t.freeLocked(o, "last lease released")
}

// release marks the object to be freed once no reader holds a lease: now,
// if none does.
func (t *objectTable) release(id fabric.ObjectID) error {
	t.mu.Lock()
	o, ok := t.objects[id]
	if !ok {
		_, gone := t.freed[id]
		t.mu.Unlock()
		if gone {
			return ErrObjectFreed
		}
		return ErrObjectNotFound
	}
	o.released = true
	if len(o.holders) > 0 {
		t.mu.Unlock()
		return nil
	}
	return t.freeLocked(o, "released by its owner, no leases")
}

// expire drops leases not renewed by now and frees released objects left
// without any; it returns how many leases expired.
func (t *objectTable) expire(now time.Time) (expired int) {
	var free []*object
	t.mu.Lock()
	for _, o := range t.objects {
		for who, until := range o.holders {
			if now.After(until) {
				delete(o.holders, who)
				expired++
			}
		}
		if o.released && len(o.holders) == 0 {
			free = append(free, o)
		}
	}
	t.mu.Unlock()
	for _, o := range free {
		t.mu.Lock()
		if _, live := t.objects[o.id]; !live {
			t.mu.Unlock()
			continue
		}
		t.freeLocked(o, "leases expired")
	}
	return expired
}

// dropPeer forgets every lease a dead peer held.
func (t *objectTable) dropPeer(who peer.ID) (dropped int) {
	t.mu.Lock()
	for _, o := range t.objects {
		if _, ok := o.holders[who]; ok {
			// Expired at once: the next expire pass drops it and frees
			// what it alone kept.
			o.holders[who] = time.Time{}
			dropped++
		}
	}
	t.mu.Unlock()
	return dropped
}

// leases counts the leases held on this runtime's objects.
func (t *objectTable) leases() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, o := range t.objects {
		n += len(o.holders)
	}
	return n
}

// freedChan returns a channel closed once the object's memory is back on
// its device.
func (t *objectTable) freedChan(id fabric.ObjectID) (<-chan struct{}, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.objects[id]; ok {
		return o.done, nil
	}
	if ch, ok := t.freed[id]; ok {
		return ch, nil
	}
	return nil, ErrObjectNotFound
}

// drained returns a channel closed when no read holds a pin.
func (t *objectTable) drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pins == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return t.unpinned
}

// free removes the object; its memory is released now or when the last pin
// goes.
func (t *objectTable) free(id fabric.ObjectID) error {
	t.mu.Lock()
	o, ok := t.objects[id]
	if !ok {
		_, gone := t.freed[id]
		t.mu.Unlock()
		if gone {
			return ErrObjectFreed
		}
		return ErrObjectNotFound
	}
	return t.freeLocked(o, "freed by its owner")
}

// freeLocked removes o from the table (t.mu held; it unlocks) and releases
// its memory unless a read still pins it.
func (t *objectTable) freeLocked(o *object, why string) error {
	delete(t.objects, o.id)
	t.freed[o.id] = o.done
	t.freedRing = append(t.freedRing, o.id)
	if len(t.freedRing) > freedMemory {
		delete(t.freed, t.freedRing[0])
		t.freedRing = t.freedRing[1:]
	}
	o.freed = true
	clear(o.holders)
	release := o.pins == 0
	t.mu.Unlock()
	t.onFree(o.id, why)
	if release {
		return o.releaseMemory()
	}
	return nil
}

// releaseMemory returns the object's memory, and the private copy of its
// view if one was staged, to the device.
func (o *object) releaseMemory() error {
	err := errors.Join(o.share.Release(), o.buf.Release())
	close(o.done)
	return err
}

func (t *objectTable) get(id fabric.ObjectID) (*object, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.objects[id]
	return o, ok
}

func (t *objectTable) ids() []fabric.ObjectID {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]fabric.ObjectID, 0, len(t.objects))
	for id := range t.objects {
		out = append(out, id)
	}
	return out
}

func (t *objectTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objects)
}

// pin is a read's hold on an object; it looks like the object's buffer.
type pin struct {
	table    *objectTable
	obj      *object
	released bool
}

func (p *pin) Device() tensor.DeviceID { return p.obj.buf.Device() }

// Len ends at the published view's end: a server that checks a range
// against it cannot serve the parent's bytes past the view.
func (p *pin) Len() int64 { return p.obj.end }

// Bytes exposes the object's memory, up to the view's end, while pinned.
func (p *pin) Bytes() []byte {
	hv, ok := p.obj.buf.(tensor.HostVisible)
	if !ok {
		return nil
	}
	b := hv.Bytes()
	if b == nil {
		return nil
	}
	return b[:p.obj.end]
}

// Release drops the pin; the last pin of a freed object releases its memory.
func (p *pin) Release() error {
	p.table.mu.Lock()
	if p.released {
		p.table.mu.Unlock()
		return nil
	}
	p.released = true
	p.obj.pins--
	p.table.pins--
	if p.table.pins == 0 {
		close(p.table.unpinned)
		p.table.unpinned = make(chan struct{})
	}
	release := p.obj.freed && p.obj.pins == 0
	p.table.mu.Unlock()
	if release {
		return p.obj.releaseMemory()
	}
	return nil
}

// layoutSum is a digest of a tensor layout (dtype, shape, effective
// strides, offset): what a reader shows its owner to confirm the ref's desc
// before it allocates, in 16 bytes whatever the rank.
type layoutSum [16]byte

func layoutOf(d tensor.Desc) layoutSum {
	r := d.Rebased() // effective strides; Rebased zeroes the offset, kept below
	e := wire.Encoder{Buf: make([]byte, 0, 64)}
	e.Byte(byte(d.DType))
	e.Uvarint(uint64(d.Offset))
	e.Uvarint(uint64(len(r.Shape)))
	for i := range r.Shape {
		e.Varint(r.Shape[i])
		e.Varint(r.Strides[i])
	}
	sum := sha256.Sum256(e.Buf)
	return layoutSum(sum[:16])
}
