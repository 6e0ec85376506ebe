// Package objstore is the owner's object table: the objects a runtime
// publishes (Put), the pins reads hold on them, the leases readers hold,
// and when each object's memory goes back to its device. It is the
// fabric.Source every transport opens a claim through, so the one check of
// token, incarnation and granted range lives here.
//
// rdt's Runtime holds one Table; the lifecycle protocol (rdt/life.go,
// lease.go) calls Lease, Unlease, Expire and DropPeer, and the actors'
// Put, Free and Release call Add, Free and Release.
package objstore

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
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Hooks are what the table tells its runtime, or asks it, at a few points.
// Set them once, before the table is shared (SetPinned excepted).
type Hooks struct {
	// OnFree runs after an object left the table, with why.
	OnFree func(id fabric.ObjectID, why string)
	// OnStage reports a view staged as a private copy for on-host grants
	// (n bytes copied), or why it could not be (err).
	OnStage func(o *Object, n int64, err error)
	// Blocked runs before every Open: a non-nil error refuses it. The
	// runtime's fault simulation (a hung owner) blocks here.
	Blocked func(ctx context.Context) error
	// Pinned runs once a read holds its pin (tests hold a read in flight).
	Pinned func(ctx context.Context)
}

// SetHooks installs h; nil members keep what was there.
func (t *Table) SetHooks(h Hooks) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.OnFree != nil {
		t.hooks.OnFree = h.OnFree
	}
	if h.OnStage != nil {
		t.hooks.OnStage = h.OnStage
	}
	if h.Blocked != nil {
		t.hooks.Blocked = h.Blocked
	}
	if h.Pinned != nil {
		t.hooks.Pinned = h.Pinned
	}
}

// freedMemory bounds how many freed object IDs are remembered so that late
// readers get errs.ObjectFreed rather than errs.ObjectNotFound.
const freedMemory = 4096

// Table holds the objects this runtime owns. It is the fabric.Source
// of every transport: reads pin an object, and the owner's memory returns to
// its allocator only when the object is freed and no read holds a pin.
type Table struct {
	incarnation uint64

	mu        sync.Mutex
	objects   map[fabric.ObjectID]*Object
	freed     map[fabric.ObjectID]chan struct{} // closed when the memory is back
	freedRing []fabric.ObjectID
	pins      int           // over all objects, for Shutdown to drain reads
	unpinned  chan struct{} // closed and replaced whenever pins drops to 0
	closing   bool          // Shutdown began: no new pins or leases
	hooks     Hooks
	reap      chan struct{} // DropPeer marked leases expired: a pass is due (Expiring)
}

type Object struct {
	ID   fabric.ObjectID
	Buf  tensor.Buffer
	Desc tensor.Desc
	// start, end: the published view's byte range in buf (desc.Span());
	// a claim grants these bytes and no others of the parent buffer.
	Start, End int64
	Layout     LayoutSum // digest of Desc, which leases must match
	// share hands out the on-host grants (shm, p2p between processes):
	// the allocation itself when the view is all of it, else a private
	// copy of the view staged at the first grant, so no reader is given a
	// descriptor of the rest of the parent allocation.
	Share *tensor.ViewShare
	Owner string // actor name
	Token []byte
	// Sums caches the checksums of the view's blocks when the object is
	// sealed (its bytes never change again: AddSealed); nil otherwise,
	// and senders checksum what they send. Set before the object is in
	// the table.
	Sums  *tensor.ChunkSums
	pins  int
	freed bool
	// released: the owner asked to free the object once no reader holds
	// it. holders: reader peers with a lease and when it expires.
	released bool
	holders  map[peer.ID]time.Time
	done     chan struct{} // closed when the memory returned to its device
}

// NoExpiry marks a lease held inside this runtime: it lives until released.
var NoExpiry = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

var _ fabric.Source = (*Table)(nil)

func New(incarnation uint64) *Table {
	return &Table{incarnation: incarnation, objects: map[fabric.ObjectID]*Object{}, freed: map[fabric.ObjectID]chan struct{}{},
		unpinned: make(chan struct{}), hooks: Hooks{OnFree: func(fabric.ObjectID, string) {}}, reap: make(chan struct{}, 1)}
}

// Add publishes desc's view of buf, which lives in mem (where a private
// copy of the view is staged if an on-host grant needs one).
func (t *Table) Add(mem tensor.Memory, buf tensor.Buffer, desc tensor.Desc, owner string) *Object {
	return t.add(mem, buf, desc, owner, false, nil)
}

// AddSealed is Add of an object whose bytes are final: its block
// checksums are computed at most once (by its first tcp read, unless sums,
// filled by the copy that made the bytes, has them) and cached with it
// (Object.Sums). sums, when not nil, covers the view desc.Span().
func (t *Table) AddSealed(mem tensor.Memory, buf tensor.Buffer, desc tensor.Desc, owner string, sums *tensor.ChunkSums) *Object {
	return t.add(mem, buf, desc, owner, true, sums)
}

func (t *Table) add(mem tensor.Memory, buf tensor.Buffer, desc tensor.Desc, owner string, sealed bool, sums *tensor.ChunkSums) *Object {
	o := &Object{Buf: buf, Desc: desc, Owner: owner, Token: make([]byte, 16), holders: map[peer.ID]time.Time{}, done: make(chan struct{}),
		Layout: LayoutOf(desc)}
	o.Start, o.End = desc.Span()
	o.Share = tensor.NewViewShare(mem, buf, o.Start, o.End)
	if sealed {
		if sums == nil {
			sums = tensor.NewChunkSums(o.Start, o.End)
		}
		o.Sums = sums
	}
	rand.Read(o.ID[:])
	rand.Read(o.Token)
	t.mu.Lock()
	t.objects[o.ID] = o
	t.mu.Unlock()
	return o
}

// Open checks the claim, including that its range lies inside the published
// view, and pins the object. It is the one place every data path (local,
// p2p, shm, rdma, tcp) resolves a claim, so the range check holds on all.
func (t *Table) Open(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.hooks.Blocked != nil {
		if err := t.hooks.Blocked(ctx); err != nil {
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
	if c.Offset < o.Start || c.Length < 0 || c.Offset > o.End || c.Length > o.End-c.Offset {
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: range [%d,+%d) outside the published view [%d,%d) of object %v", fabric.ErrUnauthorized, c.Offset, c.Length, o.Start, o.End, o.ID)
	}
	o.pins++
	t.pins++
	hook := t.hooks.Pinned
	t.mu.Unlock()
	if hook != nil {
		hook(ctx)
	}
	return &pin{table: t, obj: o}, nil
}

// check resolves a claim to its object; the caller holds t.mu.
func (t *Table) check(c fabric.Claim) (*Object, error) {
	if c.Incarnation != t.incarnation {
		return nil, errs.StaleRef
	}
	o, ok := t.objects[c.Object]
	if !ok {
		if _, gone := t.freed[c.Object]; gone {
			return nil, errs.ObjectFreed
		}
		return nil, errs.ObjectNotFound
	}
	if subtle.ConstantTimeCompare(o.Token, c.Token) != 1 {
		return nil, errs.Unauthorized
	}
	return o, nil
}

// Lease registers or renews who's lease on the claimed object until
// expires, once the claim and the layout the reader was given (a digest of
// the ref's desc) match what the owner published: a reader allocates only
// after this confirmation, so a forged shape costs it nothing.
func (t *Table) Lease(who peer.ID, c fabric.Claim, layout LayoutSum, expires time.Time) error {
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

// Confirm checks a claim and its layout without leasing: the same check a
// reader in the owner's own runtime needs before it allocates.
func (t *Table) Confirm(c fabric.Claim, layout LayoutSum) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.confirmLocked(c, layout)
	return err
}

func (t *Table) confirmLocked(c fabric.Claim, layout LayoutSum) (*Object, error) {
	o, err := t.check(c)
	if err != nil {
		return nil, err
	}
	if layout != o.Layout {
		return nil, fmt.Errorf("%w: object %v", errs.LayoutMismatch, o.ID)
	}
	return o, nil
}

// Close refuses new pins and leases from now on (Shutdown); reads that hold
// a pin finish. It returns how many do.
func (t *Table) Close() (inFlight int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	return t.pins
}

// Unlease drops who's lease; an object its owner released goes with its
// last lease.
func (t *Table) Unlease(who peer.ID, c fabric.Claim) error {
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

// missingLocked says why id is not in the table: freed, or never known.
func (t *Table) missingLocked(id fabric.ObjectID) error {
	if _, gone := t.freed[id]; gone {
		return errs.ObjectFreed
	}
	return errs.ObjectNotFound
}

// Release marks the object to be freed once no reader holds a lease: now,
// if none does.
func (t *Table) Release(id fabric.ObjectID) error {
	t.mu.Lock()
	o, ok := t.objects[id]
	if !ok {
		err := t.missingLocked(id)
		t.mu.Unlock()
		return err
	}
	o.released = true
	if len(o.holders) > 0 {
		t.mu.Unlock()
		return nil
	}
	return t.freeLocked(o, "released by its owner, no leases")
}

// Expire drops leases not renewed by now and frees released objects left
// without any; it returns how many leases expired.
func (t *Table) Expire(now time.Time) (expired int) {
	var free []*Object
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
		if _, live := t.objects[o.ID]; !live {
			t.mu.Unlock()
			continue
		}
		t.freeLocked(o, "leases expired")
	}
	return expired
}

// DropPeer forgets every lease a dead peer held.
func (t *Table) DropPeer(who peer.ID) (dropped int) {
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
	if dropped > 0 {
		select {
		case t.reap <- struct{}{}:
		default:
		}
	}
	return dropped
}

// Leases counts the leases held on this runtime's objects.
func (t *Table) Leases() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, o := range t.objects {
		n += len(o.holders)
	}
	return n
}

// FreedChan returns a channel closed once the object's memory is back on
// its device.
func (t *Table) FreedChan(id fabric.ObjectID) (<-chan struct{}, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.objects[id]; ok {
		return o.done, nil
	}
	if ch, ok := t.freed[id]; ok {
		return ch, nil
	}
	return nil, errs.ObjectNotFound
}

// Drained returns a channel closed when no read holds a pin.
func (t *Table) Drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pins == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return t.unpinned
}

// Free removes the object; its memory is released now or when the last pin
// goes.
func (t *Table) Free(id fabric.ObjectID) error {
	t.mu.Lock()
	o, ok := t.objects[id]
	if !ok {
		err := t.missingLocked(id)
		t.mu.Unlock()
		return err
	}
	return t.freeLocked(o, "freed by its owner")
}

// freeLocked removes o from the table (t.mu held; it unlocks) and releases
// its memory unless a read still pins it.
func (t *Table) freeLocked(o *Object, why string) error {
	delete(t.objects, o.ID)
	t.freed[o.ID] = o.done
	t.freedRing = append(t.freedRing, o.ID)
	if len(t.freedRing) > freedMemory {
		delete(t.freed, t.freedRing[0])
		t.freedRing = t.freedRing[1:]
	}
	o.freed = true
	clear(o.holders)
	release := o.pins == 0
	t.mu.Unlock()
	t.hooks.OnFree(o.ID, why)
	if release {
		return o.releaseMemory()
	}
	return nil
}

// releaseMemory returns the object's memory, and the private copy of its
// view if one was staged, to the device.
func (o *Object) releaseMemory() error {
	err := errors.Join(o.Share.Release(), o.Buf.Release())
	close(o.done)
	return err
}

func (t *Table) Get(id fabric.ObjectID) (*Object, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.objects[id]
	return o, ok
}

func (t *Table) IDs() []fabric.ObjectID {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]fabric.ObjectID, 0, len(t.objects))
	for id := range t.objects {
		out = append(out, id)
	}
	return out
}

func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objects)
}

// pin is a read's hold on an object; it looks like the object's buffer.
type pin struct {
	table    *Table
	obj      *Object
	released bool
}

func (p *pin) Device() tensor.DeviceID { return p.obj.Buf.Device() }

// Len ends at the published view's end: a server that checks a range
// against it cannot serve the parent's bytes past the view.
func (p *pin) Len() int64 { return p.obj.End }

// ChunkSums is the sealed object's checksum cache (tensor.Summed); nil
// for an object that may still change.
func (p *pin) ChunkSums() *tensor.ChunkSums { return p.obj.Sums }

// Bytes exposes the object's memory, up to the view's end, while pinned.
func (p *pin) Bytes() []byte {
	hv, ok := p.obj.Buf.(tensor.HostVisible)
	if !ok {
		return nil
	}
	b := hv.Bytes()
	if b == nil {
		return nil
	}
	return b[:p.obj.End]
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

// LayoutSum is a digest of a tensor layout (dtype, shape, effective
// strides, offset): what a reader shows its owner to confirm the ref's desc
// before it allocates, in 16 bytes whatever the rank.
type LayoutSum = ctlwire.Layout

func LayoutOf(d tensor.Desc) LayoutSum {
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
	return LayoutSum(sum[:16])
}

// Export shares a pinned object's published view with another process
// (the p2p and shm paths map it) for as long as the pin is held.
//
// A descriptor reaches a whole allocation (tensor.Exportable, as CUDA's
// handles do), so an object that is all of its allocation is shared as it
// is, and a view of part of one is shared as a private, sealed copy of
// exactly the view (tensor.ViewShare), staged at the first grant and kept
// until the object's memory is released. Staging is reported (OnStage);
// a copy that does not fit on the device fails the grant with
// tensor.ErrViewCopy (a tensor.ErrNotExportable), and the reader falls
// back, loudly, to a path that needs no descriptor.
func (p *pin) Export(a tensor.Access) (tensor.Handle, error) {
	h, staged, err := p.obj.Share.Export(a)
	if (staged > 0 || errors.Is(err, tensor.ErrViewCopy)) && p.table.hooks.OnStage != nil {
		p.table.hooks.OnStage(p.obj, staged, err)
	}
	return h, err
}

// Unwrap names the object's buffer, so copies reach device memory that is
// not host visible (tensor.Copy).
func (p *pin) Unwrap() (tensor.Buffer, int64) { return p.obj.Buf, 0 }

// Info is one object as the dashboard lists it.
type Info struct {
	ID     fabric.ObjectID
	Owner  string
	Device tensor.DeviceID
	Desc   tensor.Desc
	Pins   int
	Staged int64 // bytes of a private copy staged for on-host grants
}

// List returns every object in the table, in no order.
func (t *Table) List() []Info {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Info, 0, len(t.objects))
	for _, o := range t.objects {
		out = append(out, Info{ID: o.ID, Owner: o.Owner, Device: o.Buf.Device(), Desc: o.Desc, Pins: o.pins, Staged: o.Share.Staged()})
	}
	return out
}

// Pins counts the pins reads hold, over all objects.
func (t *Table) Pins() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pins
}

// Closing says whether Close was called.
func (t *Table) Closing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closing
}

// LeaseClaims applies a lease (release false) or release request from who
// to the table and returns each claim's status (ctlwire's lease table);
// layouts[i], when present, is the layout claim i's reader expects. Leases
// granted expire at expires unless renewed.
func (t *Table) LeaseClaims(who peer.ID, release bool, claims []fabric.Claim, layouts []LayoutSum, expires time.Time) []byte {
	out := make([]byte, len(claims))
	for i, c := range claims {
		var err error
		if release {
			err = t.Unlease(who, c)
		} else {
			var l LayoutSum
			if i < len(layouts) {
				l = layouts[i]
			}
			err = t.Lease(who, c, l, expires)
		}
		if err != nil {
			out[i] = ctlwire.LeaseStatusOf(err)
			continue
		}
		out[i] = ctlwire.LeaseOK
	}
	return out
}
