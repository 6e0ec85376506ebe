package fabrictest

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// incarnation is the owner life the suite's claims are issued by.
const incarnation = 7

// store is the suite's owner: an object table over a simulated device arena
// that serves as both fabric.Source (reads) and fabric.Sink (pushes). It
// counts pins so the suite can check that every transport releases what it
// opened, and it can stall or announce opens to stage faults mid-transfer.
type store struct {
	mem *tensor.SimMemory

	mu      sync.Mutex
	objects map[fabric.ObjectID]*object
	freed   map[fabric.ObjectID]bool
	onOpen  func() // called (once) on the next open, from the owner's goroutine
	stall   chan struct{}

	pins atomic.Int64
}

type object struct {
	id    fabric.ObjectID
	token []byte
	buf   tensor.Buffer
	sink  bool
	// viewStart, viewEnd: the bytes the owner published, when it published
	// a view of buf (viewEnd 0: all of buf). Claims outside are refused, as
	// rdt's object table refuses them, so a server that does not pass the
	// range it serves (Claim.For) fails the suite.
	viewStart, viewEnd int64
	// refs is 1 for the table plus one per pin: the arena block is released
	// by whichever of free and the last pin comes second.
	refs atomic.Int64
}

var (
	_ fabric.Source = (*store)(nil)
	_ fabric.Sink   = (*store)(nil)
)

func newStore(capacity int64) (*store, error) {
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), capacity)
	if err != nil {
		return nil, err
	}
	return &store{mem: mem, objects: map[fabric.ObjectID]*object{}, freed: map[fabric.ObjectID]bool{}}, nil
}

func (s *store) close() error { return s.mem.Close() }

// put allocates an object of n bytes filled with a pattern unique to it.
func (s *store) put(ctx context.Context, n int64) (*object, error) {
	return s.add(ctx, n, false)
}

// sink allocates a zeroed push destination of n bytes.
func (s *store) sinkOf(ctx context.Context, n int64) (*object, error) {
	return s.add(ctx, n, true)
}

func (s *store) add(ctx context.Context, n int64, sink bool) (*object, error) {
	buf, err := s.mem.Alloc(ctx, n)
	if err != nil {
		return nil, err
	}
	o := &object{buf: buf, token: make([]byte, 16), sink: sink}
	o.refs.Store(1)
	rand.Read(o.id[:])
	rand.Read(o.token)
	p, _ := tensor.BytesOf(buf)
	if sink {
		clear(p)
	} else {
		fill(p, binary.LittleEndian.Uint64(o.id[:]))
	}
	s.mu.Lock()
	s.objects[o.id] = o
	s.mu.Unlock()
	return o, nil
}

// free removes an object; later claims get fabric.ErrObjectFreed. Its
// memory returns to the arena when the last pin goes.
func (s *store) free(o *object) {
	s.mu.Lock()
	_, live := s.objects[o.id]
	delete(s.objects, o.id)
	s.freed[o.id] = true
	s.mu.Unlock()
	if live {
		s.unref(o)
	}
}

func (s *store) unref(o *object) {
	if o.refs.Add(-1) == 0 {
		o.buf.Release()
	}
}

func (s *store) claim(o *object) fabric.Claim {
	return fabric.Claim{Object: o.id, Incarnation: incarnation, Token: o.token}
}

func (s *store) Open(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return s.open(ctx, c, false)
}

func (s *store) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return s.open(ctx, c, true)
}

func (s *store) open(ctx context.Context, c fabric.Claim, sink bool) (tensor.Buffer, error) {
	s.mu.Lock()
	hook, stall := s.onOpen, s.stall
	s.onOpen = nil
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if stall != nil {
		select {
		case <-stall:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.Incarnation != incarnation {
		return nil, fmt.Errorf("%w: incarnation %d, owner is %d", fabric.ErrStaleRef, c.Incarnation, incarnation)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[c.Object]
	switch {
	case !ok && s.freed[c.Object]:
		return nil, fmt.Errorf("%w: %v", fabric.ErrObjectFreed, c.Object)
	case !ok || o.sink != sink:
		return nil, fmt.Errorf("%w: %v", fabric.ErrObjectNotFound, c.Object)
	case subtle.ConstantTimeCompare(o.token, c.Token) != 1:
		return nil, fmt.Errorf("%w: wrong capability token for %v", fabric.ErrUnauthorized, c.Object)
	}
	if !sink && o.viewEnd > 0 && (c.Offset < o.viewStart || c.Length < 0 || c.Offset > o.viewEnd || c.Length > o.viewEnd-c.Offset) {
		return nil, fmt.Errorf("%w: range [%d,+%d) outside the published view [%d,%d)", fabric.ErrUnauthorized, c.Offset, c.Length, o.viewStart, o.viewEnd)
	}
	o.refs.Add(1)
	s.pins.Add(1)
	return &pinnedBuffer{Buffer: o.buf, store: s, obj: o}, nil
}

// publishView makes the object a view: only [start, end) of it is granted.
func (s *store) publishView(o *object, start, end int64) {
	s.mu.Lock()
	o.viewStart, o.viewEnd = start, end
	s.mu.Unlock()
}

// nextOpen runs f when the owner next opens a claim: the transfer has then
// begun on the owner's side.
func (s *store) nextOpen(f func()) {
	s.mu.Lock()
	s.onOpen = f
	s.mu.Unlock()
}

// stallOpens makes opens block until the returned function is called.
func (s *store) stallOpens() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.stall = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.stall = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

// pinnedBuffer is what Open hands a transport: the object's memory, host
// visible and exportable like the arena underneath, released once.
type pinnedBuffer struct {
	tensor.Buffer
	store *store
	obj   *object
	done  atomic.Bool
}

var (
	_ tensor.HostVisible = (*pinnedBuffer)(nil)
	_ tensor.Exportable  = (*pinnedBuffer)(nil)
)

func (p *pinnedBuffer) Bytes() []byte {
	if p.done.Load() {
		return nil
	}
	b, _ := tensor.BytesOf(p.Buffer)
	return b
}

func (p *pinnedBuffer) Export(a tensor.Access) (tensor.Handle, error) {
	if p.done.Load() {
		return tensor.Handle{}, tensor.ErrReleased
	}
	return tensor.ExportOf(p.Buffer, a)
}

func (p *pinnedBuffer) Release() error {
	if p.done.Swap(true) {
		return nil
	}
	p.store.pins.Add(-1)
	p.store.unref(p.obj)
	return nil
}

// fill writes a pattern that differs in every 8-byte word and between
// objects, so reordered, shifted or mixed-up chunks never compare equal.
//
// norace: under -race every 8-byte store is checked, which made filling the
// suite's 1 GiB object take seconds; the memory is the store's own and is
// published to transports (under the store's lock) only after fill returns.
//
//go:norace
func fill(p []byte, seed uint64) {
	x := seed | 1
	i := 0
	for ; i+8 <= len(p); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x+uint64(i))
	}
	for ; i < len(p); i++ {
		p[i] = byte(x >> (8 * (i % 8)))
	}
}
