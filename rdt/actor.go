package rdt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlhost"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
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
	mem, err := a.rt.Memory(t.Device())
	if err != nil {
		return Ref{}, err
	}
	o := a.rt.objects.Add(mem, t.Buffer(), t.Desc(), a.name)
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

// Transfer reports how a Get was served.
type Transfer struct {
	Plan  fabric.Plan
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
	done := a.rt.observeRead(a.name, ref, a.rt.endpoint(dst)) // observe.go
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
	ctx, end, err := a.rt.beginGet(ctx)
	if err != nil {
		return tensor.Tensor{}, Transfer{}, err
	}
	defer end()
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	ctx, unguard, err := a.rt.guard(ctx, ref)
	if err != nil {
		return tensor.Tensor{}, Transfer{}, err
	}
	defer unguard()
	remote := a.rt.remoteFor(ref)
	plan := a.rt.planner.PlanRead(remote, a.rt.endpoint(dst)) // what Explain prints
	alloc := func(ctx context.Context, n int64) (tensor.Buffer, error) {
		mem, err := a.rt.Memory(dst)
		if err != nil {
			return nil, err
		}
		return mem.Alloc(ctx, n)
	}
	// The reader never sees a partial tensor: on failure Fetch returns the
	// buffer to its device before the error comes back. The owner's death
	// cancels ctx: why says so, not "context canceled".
	buf, st, err := a.rt.planner.Fetch(ctx, &plan, remote, alloc)
	if err != nil {
		return tensor.Tensor{}, Transfer{Plan: plan}, a.rt.why(ctx, ref, err)
	}
	desc := ref.Desc.Rebased()
	if st.ZeroCopy {
		desc = ref.Desc // the owner's own buffer: the view keeps its offset
	}
	out, err := tensor.New(buf, desc)
	if err != nil {
		buf.Release()
		return tensor.Tensor{}, Transfer{Plan: plan}, err
	}
	return out, Transfer{Plan: plan, Stats: st}, nil
}

// GetInto reads the ref's tensor into dst, a tensor the caller allocated
// with the same number of bytes (for reuse of buffers across weight syncs).
// Only a nil error means dst holds the tensor, all of it, verified; after
// an error (a path that failed part way, the owner's death) dst's contents
// are undefined and must not be used.
func (a *Actor) GetInto(ctx context.Context, ref Ref, dst tensor.Tensor) (Transfer, error) {
	done := a.rt.observeRead(a.name, ref, a.rt.endpoint(dst.Device())) // observe.go
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
	target := dst.Buffer()
	if start, _ := dst.Desc().Span(); start != 0 {
		return Transfer{}, fmt.Errorf("%w: destination must start at its buffer's beginning", tensor.ErrBadDesc)
	}
	ctx, end, err := a.rt.beginGet(ctx)
	if err != nil {
		return Transfer{}, err
	}
	defer end()
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	ctx, unguard, err := a.rt.guard(ctx, ref)
	if err != nil {
		return Transfer{}, err
	}
	defer unguard()
	st, plan, err := a.rt.planner.Read(ctx, remote, a.rt.endpoint(dst.Device()), target)
	if err != nil {
		return Transfer{Plan: plan}, a.rt.why(ctx, ref, err)
	}
	return Transfer{Plan: plan, Stats: st}, nil
}

// guard prepares a Get of a ref owned by another runtime: it takes a Get's
// hold on the ref for the Get's duration (a lease with the owner, which
// also checks the ref and its layout: freed, stale or forged refs fail
// here, before the reader allocates), watches the owner, and returns a
// context cancelled with ErrOwnerDied if the owner incarnation is declared
// dead while the Get runs. A ref this runtime owns is checked against its
// own object table.
func (r *Runtime) guard(ctx context.Context, ref Ref) (context.Context, func(), error) {
	if ref.Owner == r.host.ID() {
		if err := r.objects.Confirm(fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}, objstore.LayoutOf(ref.Desc)); err != nil {
			return nil, nil, fmt.Errorf("%v: %w", ref, err)
		}
		return ctx, func() {}, nil
	}
	unuse := r.peers.Use(ref.Owner)
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	watch := func() {
		death := r.peers.DeathOf(ref.Owner, ref.Incarnation)
		go func() {
			select {
			case <-death:
				cancel(r.deathVerdict(ctx, ref, "a Get waited on it"))
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	// The death watch starts before the lease request: a hung owner (its
	// connection open, nothing answering) never answers that request
	// either, and only the heartbeats' verdict ends it in time. Except when
	// this runtime knows another incarnation of the owner: the ref may name
	// a newer one it has not met yet (deathOf would take it for the older),
	// so the lease's answer says which incarnation runs first.
	_, other := r.peers.Replaced(ref.Owner, ref.Incarnation)
	if !other {
		watch()
	}
	if err := r.hold(ctx, "", ref); err != nil {
		err = r.why(ctx, ref, err)
		if context.Cause(ctx) == nil && r.frozenOwner(ctx, ref, err) {
			err = r.frozenErr(ref, err)
		}
		close(done)
		cancel(nil)
		unuse()
		return nil, nil, err
	}
	if other {
		watch()
	}
	return ctx, func() {
		close(done)
		cancel(nil)
		unuse()
		r.unget(ref)
	}, nil
}

// why turns a failed Get's error into the condition behind it: the owner's
// death (signalled, or confirmed now because the data path broke and the
// owner no longer answers), Shutdown, or the error itself.
func (r *Runtime) why(ctx context.Context, ref Ref, err error) error {
	if cause := context.Cause(ctx); cause != nil && (errors.Is(cause, ErrOwnerDied) || errors.Is(cause, ErrPeerUnreachable) || errors.Is(cause, ErrStaleRef) || errors.Is(cause, ErrClosed)) {
		if errors.Is(err, cause) {
			return r.counted(err)
		}
		return r.counted(fmt.Errorf("%w; transfer: %w", cause, err))
	}
	if ref.Owner == r.host.ID() || fabric.Terminal(err) || errors.Is(err, ErrOwnerDied) {
		return r.counted(err)
	}
	if errors.Is(err, fabric.ErrPeerClosed) || errors.Is(err, fabric.ErrStalled) || errors.Is(err, ErrPeerUnreachable) {
		// Is the owner gone, or only the path? One ping, at most a
		// heartbeat interval, tells.
		ctlhost.ClearBackoff(r.host, ref.Owner)
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.HeartbeatInterval)
		reply, perr := r.call(pctx, ref.Owner, ctlwire.LifeMsg{Kind: ctlwire.LifePing})
		cancel()
		switch {
		case perr != nil && !r.isClosed() && r.peers.SeenAlive(ref.Owner, ref.Incarnation):
			r.peers.DeclareDead(ref.Owner, "connection lost")
			return r.counted(r.ownerDiedErr(ref, err))
		case perr != nil && !errors.Is(err, ErrPeerUnreachable):
			// Never reached on the control channel: not known to have
			// lived, so not known to have died.
			return fmt.Errorf("%w; transfer: %w", perr, err)
		case perr == nil && reply.Incarnation != ref.Incarnation:
			r.peers.SawAlive(ref.Owner, reply.Incarnation)
			return fmt.Errorf("%w: owner restarted; transfer: %w", ErrStaleRef, err)
		}
	}
	return err
}

func (r *Runtime) counted(err error) error {
	if errors.Is(err, ErrOwnerDied) {
		r.lifeMetrics.ownerDied.Inc()
	}
	return err
}

// Hold registers the actor as a holder of a ref owned by another runtime:
// the owner keeps the object while some reader holds it, even after its own
// actor Released it. Get needs no Hold (it leases the object for its own
// duration); Hold is for a reader that wants to Get the ref again later,
// or pass it on, and must not find it freed meanwhile. The hold lasts until Release,
// the reader's Shutdown, or the reader's death (its lease expires on the
// owner after Config.LeaseExpiry).
func (a *Actor) Hold(ctx context.Context, ref Ref) error {
	if a.rt.isClosed() {
		return ErrClosed
	}
	if ref.Owner == a.rt.host.ID() {
		if ref.Incarnation != a.rt.incarnation {
			return ErrStaleRef
		}
		return nil // the owner's runtime does not lease from itself
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.hold(ctx, a.name, ref)
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
	return a.rt.unhold(ctx, a.name, ref)
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
	plan := a.rt.planner.PlanRead(a.rt.remoteFor(ref), a.rt.endpoint(dst)) // the value Get runs
	noteViewCopy(&plan, ref)
	a.rt.noteMemory(&plan, dst) // devices.go
	if err := a.mayUse(dst); err != nil {
		plan.Refuse(err)
	} else if err := ref.Desc.Validate(); err != nil {
		plan.Refuse(fmt.Errorf("%w: %v", ErrMalformedRef, err))
	}
	return plan
}

// noteViewCopy says on the on-host candidates that pass a descriptor to
// another process (p2p, shm) that the owner serves a private copy of the
// ref's view, when the ref shows the view is only part of its buffer (it
// starts past the buffer's start; a view that starts at 0 but ends short
// of its buffer is staged too, which the ref does not show).
func noteViewCopy(plan *fabric.Plan, ref Ref) {
	if start, _ := ref.Desc.Span(); start == 0 || plan.Src.Process == plan.Dst.Process {
		return
	}
	for i, c := range plan.Candidates {
		if c.Usable && (c.Transport == fabric.P2P || c.Transport == fabric.SHM) {
			plan.Candidates[i].Reason += "; the owner grants a private copy of this view (part of a larger allocation), staged once at the first on-host grant"
		}
	}
}

func (r *Runtime) remoteFor(ref Ref) fabric.Remote {
	off, n := ref.span()
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: refwire.PeerString(ref.Owner) + "/" + strconv.FormatUint(ref.Incarnation, 16), Host: ref.Host, Device: ref.Device},
		Peer:     refwire.PeerString(ref.Owner),
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
