package rdt

import (
	"context"
	"fmt"
	"slices"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Actor is a named participant on a runtime. It owns the objects it Puts,
// reads others' objects onto the devices it may use, and exchanges control
// messages with other actors.
type Actor struct {
	rt      *Runtime
	name    string
	devices []tensor.DeviceID
	inbox   chan Message
}

// ActorOption configures Spawn.
type ActorOption func(*Actor)

// WithDevices limits the actor to the given devices (default: all of the
// runtime's devices).
func WithDevices(devs ...tensor.DeviceID) ActorOption {
	return func(a *Actor) { a.devices = slices.Clone(devs) }
}

// ActorAddr says where an actor can be reached.
type ActorAddr struct {
	Peer  peer.ID
	Name  string
	Addrs []ma.Multiaddr // the runtime's control addresses, so a receiver can reply
}

func (a ActorAddr) String() string { return a.Name + "@" + shortID(a.Peer) }

// Message is a control message: a small payload plus references to tensors
// that stay where they are.
type Message struct {
	From    ActorAddr
	Payload []byte
	Refs    []Ref
}

// Spawn registers an actor under a name unique in the runtime.
func (r *Runtime) Spawn(name string, opts ...ActorOption) (*Actor, error) {
	if name == "" || len(name) > ctlwire.MaxString {
		return nil, fmt.Errorf("rdt: actor name must be 1..%d bytes", ctlwire.MaxString)
	}
	a := &Actor{rt: r, name: name, devices: r.Devices(), inbox: make(chan Message, r.cfg.InboxSize)}
	for _, o := range opts {
		o(a)
	}
	for _, d := range a.devices {
		if _, ok := r.devs.Memory(d); !ok {
			return nil, fmt.Errorf("%w: actor %q asks for %v, host %s has %v", ErrUnknownDevice, name, d, r.cfg.Host, r.Devices())
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if _, dup := r.actors[name]; dup {
		return nil, fmt.Errorf("rdt: actor %q already exists on %s", name, r.cfg.Host)
	}
	r.actors[name] = a
	return a, nil
}

// Name returns the actor's name.
func (a *Actor) Name() string { return a.name }

// Devices returns the devices the actor may use.
func (a *Actor) Devices() []tensor.DeviceID { return slices.Clone(a.devices) }

// Runtime returns the runtime the actor lives on.
func (a *Actor) Runtime() *Runtime { return a.rt }

// Addr returns the actor's address.
func (a *Actor) Addr() ActorAddr {
	return ActorAddr{Peer: a.rt.host.ID(), Name: a.name, Addrs: a.rt.host.Addrs()}
}

func (a *Actor) mayUse(dev tensor.DeviceID) error { return a.who().MayUse(dev) }

// PutOption changes how Put publishes.
type PutOption func(*putOptions)

type putOptions struct {
	sealed bool
	sums   *tensor.ChunkSums
}

// Sealed promises that the tensor's bytes never change again while it is
// published: its owner then computes the tcp checksum of each block once
// (the first tcp read does, as it sends) and serves every later read's
// from that cache instead of reading the object's memory again for them.
// Bytes changed anyway reach readers as fabric.ErrCorrupt. Leave it out
// for memory that may change (a buffer the caller keeps writing, a
// mailbox); on device memory it changes nothing.
func Sealed() PutOption { return func(o *putOptions) { o.sealed = true } }

// SealedWith is Sealed with the checksums already known: sums, made with
// tensor.NewChunkSums over the tensor's span (t.Desc().Span()) and filled by the
// copy that wrote the bytes (ChunkSums.Copy, one pass for both), so not
// even the first read checksums them.
func SealedWith(sums *tensor.ChunkSums) PutOption {
	return func(o *putOptions) { o.sealed, o.sums = true, sums }
}

// Put publishes a tensor that lives in this runtime's device memory and
// returns a reference to it. Nothing is copied: the object is the tensor's
// own buffer, and the runtime now owns its lifetime (Free releases it).
func (a *Actor) Put(ctx context.Context, t tensor.Tensor, opts ...PutOption) (Ref, error) {
	if err := ctx.Err(); err != nil {
		return Ref{}, err
	}
	if a.rt.isClosed() {
		return Ref{}, ErrClosed
	}
	if !t.Valid() {
		return Ref{}, fmt.Errorf("%w: empty tensor", tensor.ErrBadDesc)
	}
	if err := a.mayUse(t.Device()); err != nil {
		return Ref{}, err
	}
	mem, err := a.rt.Memory(t.Device())
	if err != nil {
		return Ref{}, err
	}
	var po putOptions
	for _, opt := range opts {
		opt(&po)
	}
	if po.sums != nil {
		start, end := t.Desc().Span()
		if b, e := po.sums.Span(); b != start || e != end {
			return Ref{}, fmt.Errorf("%w: checksums of bytes [%d,%d) for a tensor spanning [%d,%d)", tensor.ErrBadDesc, b, e, start, end)
		}
	}
	var o *objstore.Object
	if po.sealed && !tensor.IsDevice(t.Buffer()) {
		o = a.rt.objects.AddSealed(mem, t.Buffer(), t.Desc(), a.name, po.sums)
	} else {
		// Device memory is staged per read and checksummed from the
		// stage: there is nothing for a cache to save.
		o = a.rt.objects.Add(mem, t.Buffer(), t.Desc(), a.name)
	}
	return a.rt.refFor(o), nil
}

func (r *Runtime) refFor(o *objstore.Object) Ref {
	return Ref{
		Object: o.ID, Owner: r.host.ID(), Incarnation: r.incarnation, Addrs: refwire.Addrs(r.host.Addrs()),
		DataAddrs: r.dataAddrs(), Host: r.cfg.Host,
		Device: o.Buf.Device(), Desc: o.Desc, Transports: r.servedTransports(),
		Token: o.Token,
	}
}

// Transfer reports how a Get was served: the plan it ran (plain data, as
// Explain's) and what moved.
type Transfer struct {
	Plan  Plan
	Stats fabric.Stats
	// Notified is, for an item of a PushBatch, how many pushes shared its
	// push notice to the slot's runtime (itself included): one control
	// round trip for all of them. 0 otherwise.
	Notified int
}

// Get fetches the ref's tensor into memory on dst. A reader on the owner's
// own device gets a zero-copy view; everyone else gets a copy that arrived
// and verified in full. Release the result when done; that is all a reader
// has to release: the lease Get took on the owner's object lasts for the
// Get (and a moment after, so a loop of Gets reuses it), not until a
// Release of the ref. Use Hold to keep the object alive longer.
func (a *Actor) Get(ctx context.Context, ref Ref, dst tensor.DeviceID) (tensor.Tensor, error) {
	t, _, err := a.Fetch(ctx, ref, dst)
	return t, err
}

// Fetch is Get that also reports the plan and the transfer's statistics.
func (a *Actor) Fetch(ctx context.Context, ref Ref, dst tensor.DeviceID) (tensor.Tensor, Transfer, error) {
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	t, x, err := a.rt.reader.Fetch(ctx, a.who(), refwire.Ref(ref), dst)
	return t, transfer(x), err
}

// GetInto reads the ref's tensor into dst, a tensor the caller allocated
// with the same number of bytes (for reuse of buffers across weight syncs).
// Only a nil error means dst holds the tensor, all of it, verified; after
// an error (a path that failed part way, the owner's death) dst's contents
// are undefined and must not be used.
func (a *Actor) GetInto(ctx context.Context, ref Ref, dst tensor.Tensor) (Transfer, error) {
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	x, err := a.rt.reader.Into(ctx, a.who(), refwire.Ref(ref), dst)
	return transfer(x), err
}

// Hold registers the actor as a holder of a ref owned by another runtime:
// the owner keeps the object while some reader holds it, even after its own
// actor Released it. Get needs no Hold (it leases the object for its own
// duration); Hold is for a reader that wants to Get the ref again later,
// or pass it on, and must not find it freed meanwhile. The hold lasts until Release,
// the reader's Shutdown, or the reader's death (its lease expires on the
// owner after Config.LeaseExpiry).
func (a *Actor) Hold(ctx context.Context, ref Ref) error {
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.reader.HoldFor(ctx, a.name, refwire.Ref(ref))
}

// Release says the actor is done with a ref. A reader drops its hold (and
// its runtime's lease once no actor of it holds the ref). The owner actor
// asks for the object to be freed once no reader holds it any more: at once
// if none does, else when the last lease is released or expires. Use
// WaitFreed to know when the memory is back; use Free to revoke at once.
func (a *Actor) Release(ctx context.Context, ref Ref) error {
	if ref.Owner == a.rt.host.ID() {
		if ref.Incarnation != a.rt.incarnation {
			return ErrStaleRef
		}
		o, ok := a.rt.objects.Get(ref.Object)
		if !ok || o.Owner != a.name {
			return nil
		}
		return a.rt.objects.Release(ref.Object)
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.leases.Unhold(ctx, a.name, refwire.Ref(ref))
}

// WaitFreed blocks until an object this runtime owns has been freed and its
// memory returned to its device (after Free, or after Release and the last
// reader lease), or ctx is done. Without a deadline it waits at most
// Config.TransferTimeout.
func (a *Actor) WaitFreed(ctx context.Context, ref Ref) error {
	if ref.Owner != a.rt.host.ID() || ref.Incarnation != a.rt.incarnation {
		return fmt.Errorf("%w: %v belongs to %s", ErrNotOwner, ref, shortID(ref.Owner))
	}
	ch, err := a.rt.objects.FreedChan(ref.Object)
	if err != nil {
		return err
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rdt: waiting for %v to be freed: %w", ref, ctx.Err())
	}
}

// Watch reports liveness changes of another runtime; see Runtime.WatchPeer.
func (a *Actor) Watch(ctx context.Context, id peer.ID) <-chan PeerEvent {
	return a.rt.WatchPeer(ctx, id)
}

// Free releases an object this actor's runtime owns. Readers that later
// present the ref get ErrObjectFreed; reads in flight finish first and the
// memory returns to its device when the last one does.
func (a *Actor) Free(ctx context.Context, ref Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ref.Owner != a.rt.host.ID() || ref.Incarnation != a.rt.incarnation {
		return fmt.Errorf("%w: %v belongs to %s", ErrNotOwner, ref, shortID(ref.Owner))
	}
	return a.rt.objects.Free(ref.Object)
}

// explain is Explain's plan as the planner makes it (explain.go).
// A destination Get would refuse (a device the actor may not use, a
// malformed ref) makes a plan with nothing chosen and Err saying why.
func (a *Actor) explain(ref Ref, dst tensor.DeviceID) fabric.Plan {
	return a.rt.reader.Explain(a.who(), refwire.Ref(ref), dst)
}

func (r *Runtime) remoteFor(ref Ref) fabric.Remote { return reader.Remote(refwire.Ref(ref)) }

// Receive returns the next message sent to the actor.
func (a *Actor) Receive(ctx context.Context) (Message, error) {
	select {
	case m := <-a.inbox:
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-a.rt.done:
		return Message{}, ErrClosed
	}
}
