package rdt

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/fabric"
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
	if name == "" || len(name) > maxRefString {
		return nil, fmt.Errorf("rdt: actor name must be 1..%d bytes", maxRefString)
	}
	a := &Actor{rt: r, name: name, devices: r.Devices(), inbox: make(chan Message, r.cfg.InboxSize)}
	for _, o := range opts {
		o(a)
	}
	for _, d := range a.devices {
		if _, ok := r.devices[d]; !ok {
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

func (a *Actor) mayUse(dev tensor.DeviceID) error {
	if !slices.Contains(a.devices, dev) {
		return fmt.Errorf("%w: actor %q may use %v, not %v", ErrUnknownDevice, a.name, a.devices, dev)
	}
	return nil
}

// Put publishes a tensor that lives in this runtime's device memory and
// returns a reference to it. Nothing is copied: the object is the tensor's
// own buffer, and the runtime now owns its lifetime (Free releases it).
func (a *Actor) Put(ctx context.Context, t tensor.Tensor) (Ref, error) {
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
	o := a.rt.objects.add(t.Buffer(), t.Desc(), a.name)
	return a.rt.refFor(o), nil
}

func (r *Runtime) refFor(o *object) Ref {
	addrs := make([]string, 0, 2)
	for _, m := range r.host.Addrs() {
		addrs = append(addrs, m.String())
	}
	return Ref{
		Object: o.id, Owner: r.host.ID(), Incarnation: r.incarnation, Addrs: addrs,
		DataAddrs: map[string]string{fabric.TCP: r.tcpSrv.Addr()}, Host: r.cfg.Host,
		Device: o.buf.Device(), Desc: o.desc, Transports: []string{fabric.Local, fabric.P2P, fabric.TCP},
		Token: o.token,
	}
}

// Transfer reports how a Get was served.
type Transfer struct {
	Plan  fabric.Plan
	Stats fabric.Stats
}

// Get fetches the ref's tensor into memory on dst. A reader on the owner's
// own device gets a zero-copy view; everyone else gets a copy that arrived
// and verified in full. Release the result when done.
func (a *Actor) Get(ctx context.Context, ref Ref, dst tensor.DeviceID) (tensor.Tensor, error) {
	t, _, err := a.Fetch(ctx, ref, dst)
	return t, err
}

// Fetch is Get that also reports the plan and the transfer's statistics.
func (a *Actor) Fetch(ctx context.Context, ref Ref, dst tensor.DeviceID) (tensor.Tensor, Transfer, error) {
	done := a.rt.obs.begin(a.name, ref, a.rt.endpoint(dst)) // observe.go
	t, x, err := a.fetch(ctx, ref, dst)
	done(x, err)
	return t, x, err
}

func (a *Actor) fetch(ctx context.Context, ref Ref, dst tensor.DeviceID) (tensor.Tensor, Transfer, error) {
	if a.rt.isClosed() {
		return tensor.Tensor{}, Transfer{}, ErrClosed
	}
	if err := a.mayUse(dst); err != nil {
		return tensor.Tensor{}, Transfer{}, err
	}
	if err := ref.Desc.Validate(); err != nil {
		return tensor.Tensor{}, Transfer{}, fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	remote := a.rt.remoteFor(ref)
	dstEp := a.rt.endpoint(dst)
	plan := a.rt.planner.Plan(remote.Endpoint, dstEp)

	if plan.Chosen == fabric.Local && ref.Device == dst {
		start := time.Now()
		buf, err := plan.ChosenTransport().(fabric.Viewer).View(ctx, remote)
		if err != nil {
			return tensor.Tensor{}, Transfer{Plan: plan}, err
		}
		view, err := tensor.New(buf, ref.Desc)
		if err != nil {
			buf.Release()
			return tensor.Tensor{}, Transfer{Plan: plan}, err
		}
		st := fabric.Stats{Transport: fabric.Local, Bytes: remote.Length, Duration: time.Since(start), ZeroCopy: true}
		return view, Transfer{Plan: plan, Stats: st}, nil
	}

	mem, err := a.rt.Memory(dst)
	if err != nil {
		return tensor.Tensor{}, Transfer{Plan: plan}, err
	}
	buf, err := mem.Alloc(ctx, remote.Length)
	if err != nil {
		return tensor.Tensor{}, Transfer{Plan: plan}, err
	}
	st, plan, err := a.rt.planner.Read(ctx, remote, dstEp, buf)
	if err != nil {
		buf.Release()
		return tensor.Tensor{}, Transfer{Plan: plan}, err
	}
	out, err := tensor.New(buf, ref.Desc.Rebased())
	if err != nil {
		buf.Release()
		return tensor.Tensor{}, Transfer{Plan: plan}, err
	}
	return out, Transfer{Plan: plan, Stats: st}, nil
}

// GetInto reads the ref's tensor into dst, a tensor the caller allocated
// with the same number of bytes (for reuse of buffers across weight syncs).
func (a *Actor) GetInto(ctx context.Context, ref Ref, dst tensor.Tensor) (Transfer, error) {
	done := a.rt.obs.begin(a.name, ref, a.rt.endpoint(dst.Device())) // observe.go
	x, err := a.getInto(ctx, ref, dst)
	done(x, err)
	return x, err
}

func (a *Actor) getInto(ctx context.Context, ref Ref, dst tensor.Tensor) (Transfer, error) {
	if a.rt.isClosed() {
		return Transfer{}, ErrClosed
	}
	if !dst.Valid() {
		return Transfer{}, fmt.Errorf("%w: empty destination", tensor.ErrBadDesc)
	}
	if err := a.mayUse(dst.Device()); err != nil {
		return Transfer{}, err
	}
	if err := ref.Desc.Validate(); err != nil {
		return Transfer{}, fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	remote := a.rt.remoteFor(ref)
	if !dst.Desc().Contiguous() {
		return Transfer{}, fmt.Errorf("%w: destination must be contiguous", tensor.ErrBadDesc)
	}
	if start, end := dst.Desc().Span(); end-start < remote.Length {
		return Transfer{}, fmt.Errorf("%w: destination holds %d bytes, the object has %d", ErrTooSmall, end-start, remote.Length)
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	target := dst.Buffer()
	if start, _ := dst.Desc().Span(); start != 0 {
		return Transfer{}, fmt.Errorf("%w: destination must start at its buffer's beginning", tensor.ErrBadDesc)
	}
	st, plan, err := a.rt.planner.Read(ctx, remote, a.rt.endpoint(dst.Device()), target)
	return Transfer{Plan: plan, Stats: st}, err
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
	return a.rt.objects.free(ref.Object)
}

// Explain says which path a Get of ref onto dst would take, and why the
// other transports would not be used.
func (a *Actor) Explain(ref Ref, dst tensor.DeviceID) fabric.Plan {
	return a.rt.planner.Plan(a.rt.remoteFor(ref).Endpoint, a.rt.endpoint(dst))
}

func (r *Runtime) remoteFor(ref Ref) fabric.Remote {
	off, n := ref.span()
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: fmt.Sprintf("%s/%x", ref.Owner, ref.Incarnation), Host: ref.Host, Device: ref.Device},
		Peer:     ref.Owner.String(),
		Addrs:    ref.DataAddrs,
		Claim:    fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token},
		Offset:   off,
		Length:   n,
		DType:    ref.Desc.DType,
	}
}

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
