package rdt

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
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
	freed     map[fabric.ObjectID]struct{}
	freedRing []fabric.ObjectID
}

type object struct {
	id    fabric.ObjectID
	buf   tensor.Buffer
	desc  tensor.Desc
	owner string // actor name
	token []byte
	pins  int
	freed bool
}

var _ fabric.Source = (*objectTable)(nil)

func newObjectTable(incarnation uint64) *objectTable {
	return &objectTable{incarnation: incarnation, objects: map[fabric.ObjectID]*object{}, freed: map[fabric.ObjectID]struct{}{}}
}

func (t *objectTable) add(buf tensor.Buffer, desc tensor.Desc, owner string) *object {
	o := &object{buf: buf, desc: desc, owner: owner, token: make([]byte, 16)}
	rand.Read(o.id[:])
	rand.Read(o.token)
	t.mu.Lock()
	t.objects[o.id] = o
	t.mu.Unlock()
	return o
}

// Open checks the claim and pins the object.
func (t *objectTable) Open(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.Incarnation != t.incarnation {
		return nil, ErrStaleRef
	}
	t.mu.Lock()
	defer t.mu.Unlock()
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
	o.pins++
	return &pin{table: t, obj: o}, nil
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
	delete(t.objects, id)
	t.freed[id] = struct{}{}
	t.freedRing = append(t.freedRing, id)
	if len(t.freedRing) > freedMemory {
		delete(t.freed, t.freedRing[0])
		t.freedRing = t.freedRing[1:]
	}
	o.freed = true
	release := o.pins == 0
	t.mu.Unlock()
	if release {
		return o.buf.Release()
	}
	return nil
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
func (p *pin) Len() int64              { return p.obj.buf.Len() }

// Bytes exposes the object's memory while pinned.
func (p *pin) Bytes() []byte {
	hv, ok := p.obj.buf.(tensor.HostVisible)
	if !ok {
		return nil
	}
	return hv.Bytes()
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
	release := p.obj.freed && p.obj.pins == 0
	p.table.mu.Unlock()
	if release {
		return p.obj.buf.Release()
	}
	return nil
}
