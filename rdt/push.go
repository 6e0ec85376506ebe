package rdt

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/notices"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/pushrun"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Push is the owner-driven direction: a reader reserves a Slot (memory on
// its own device), hands the slot's Ref to the owner, and the owner writes
// its tensor straight into it (rdma WRITE, a copy into the reader's mapped
// arena, or a tcp push), then tells the reader the push completed. This is
// broadcast-style weight sync: a trainer pushes each step's weights into
// every reader's slot without waiting for each reader to ask.
//
// The slot is filled in place: a push that is in progress overwrites what
// the previous one left. Readers that must read one version while the next
// arrives keep two slots and alternate.

const pushProtocol = protocol.ID("/tensorlane/push/1.0.0")

// Slot is reader-allocated memory that owners push tensors into. Its
// state (generations, pins, the broadcast filling it) is objstore.Slot's.
type Slot struct {
	rt    *Runtime
	actor *Actor
	s     *objstore.Slot
}

// Reserve allocates a slot for a tensor of layout desc on dev, one of the
// actor's devices, for owners to push into. Send slot.Ref() to the owner.
func (a *Actor) Reserve(ctx context.Context, desc tensor.Desc, dev tensor.DeviceID, opts ...SlotOption) (*Slot, error) {
	if a.rt.isClosed() {
		return nil, ErrClosed
	}
	if err := a.mayUse(dev); err != nil {
		return nil, err
	}
	if err := desc.Validate(); err != nil {
		return nil, err
	}
	mem, err := a.rt.Memory(dev)
	if err != nil {
		return nil, err
	}
	buf, err := mem.Alloc(ctx, spanBytes(desc))
	if err != nil {
		return nil, err
	}
	return a.addSlot(buf, desc, opts), nil
}

// addSlot makes buf, holding a tensor of layout desc, a slot of this
// actor with a fresh id and token, and publishes it in the sink table.
func (a *Actor) addSlot(buf tensor.Buffer, desc tensor.Desc, opts []SlotOption) *Slot {
	s := &Slot{rt: a.rt, actor: a, s: objstore.NewSlot(buf, desc)}
	for _, o := range opts {
		o(s)
	}
	a.rt.sinks.Add(s.s)
	return s
}

// Ref is what the pushing owner needs: where the slot lives and the
// capability to write it.
func (s *Slot) Ref() Ref {
	r := s.rt
	addrs := make([]string, 0, 2)
	for _, m := range r.host.Addrs() {
		addrs = append(addrs, m.String())
	}
	return Ref{
		Object: s.s.ID, Owner: r.host.ID(), Incarnation: r.incarnation, Addrs: addrs,
		DataAddrs: r.dataAddrs(), Host: r.cfg.Host, Device: s.s.Buf.Device(), Desc: s.s.Desc,
		Transports: r.servedTransports(), Token: s.s.Token,
	}
}

// Pushes is the number of pushes completed so far.
func (s *Slot) Pushes() uint64 {
	n, _ := s.s.Generation()
	return n
}

// Wait blocks until more than after pushes have completed and returns the
// count and a view of the slot (valid until Close; the next push overwrites
// it in place).
func (s *Slot) Wait(ctx context.Context, after uint64) (uint64, tensor.Tensor, error) {
	ctx, cancel := s.rt.bounded(ctx)
	defer cancel()
	n, err := s.s.Wait(ctx, after, s.rt.done)
	if err != nil {
		return n, tensor.Tensor{}, err
	}
	t, err := tensor.New(nopRelease{s.s.Buf}, s.s.Desc)
	return n, t, err
}

// Close unregisters the slot: later pushes get ErrObjectFreed, and its
// memory returns to the device once no push in progress holds it.
// Idempotent.
func (s *Slot) Close() error { return s.rt.sinks.CloseSlot(s.s) }

// nopRelease lends a buffer to a view without giving up ownership.
type nopRelease struct{ tensor.Buffer }

func (nopRelease) Release() error { return nil }

// Unwrap names the lent buffer (tensor.Copy reaches device memory so).
func (n nopRelease) Unwrap() (tensor.Buffer, int64) { return n.Buffer, 0 }

// Bytes exposes the lent buffer's memory.
func (n nopRelease) Bytes() []byte {
	b, _ := tensor.BytesOf(n.Buffer)
	return b
}

// Push writes the object behind src, which this actor's runtime owns, into
// the slot that dst names, over the best path that can push, and then tells
// the slot's runtime that the push completed. src and dst must have the
// same size (with PushRuns: the runs and dst).
func (a *Actor) Push(ctx context.Context, src Ref, dst Ref, opts ...PushOption) (Transfer, error) {
	if a.rt.isClosed() {
		return Transfer{}, ErrClosed
	}
	var o pushOpts
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	x, err := pushrun.One(ctx, pushEnv{a.rt}, refwire.Ref(src), refwire.Ref(dst), o.runs)
	return Transfer{Plan: planFrom(x.Plan), Stats: x.Stats}, err
}

// Run is a range of an object's bytes: Len bytes from Off (PushRuns).
type Run = fabric.Run

// PushOption changes one Push.
type PushOption func(*pushOpts)

type pushOpts struct{ runs []Run }

// PushRuns makes a Push send the concatenation of runs of the source
// object's bytes (offsets from its first byte, as Desc.Span lays it out),
// in order, which must fill the slot exactly: a resharded weight's strided
// rows, say, straight from the shard that holds them. A path that can
// (tcp, rdma, shm: fabric.GatherWriter) sends them from the object with no
// packed copy of them; any other gets them packed into staging memory of this
// runtime first, logged and counted
// (tensorlane_gather_packed_total{transport}).
// Runs outside the object, of no bytes, or not adding up to the slot's
// size fail the push with ErrBadRuns before anything moves. runs must not
// change until Push returns.
func PushRuns(runs []Run) PushOption {
	return func(o *pushOpts) {
		o.runs = runs
		if o.runs == nil {
			o.runs = []Run{} // refused as no runs, not taken for a whole push
		}
	}
}

// openPush checks that this runtime owns src and that its bytes fit dst's
// slot exactly (with runs: that they lie in src's bytes and fill the slot
// exactly), pins them and returns them (the window of pin that moves; with
// runs, all of src's bytes) with the slot's Remote. The caller releases
// pin.
func (r *Runtime) openPush(ctx context.Context, src, dst Ref, runs []Run) (pin tensor.Buffer, win *objstore.Window, remote fabric.Remote, err error) {
	if src.Owner != r.host.ID() || src.Incarnation != r.incarnation {
		return nil, nil, remote, fmt.Errorf("%w: push source %v is not owned by this runtime", ErrNotOwner, src)
	}
	start, end := src.Desc.Span()
	pin, err = r.objects.Open(ctx, fabric.Claim{Object: src.Object, Incarnation: src.Incarnation, Token: src.Token}.For(start, end-start))
	if err != nil {
		return nil, nil, remote, err
	}
	if end > pin.Len() {
		pin.Release()
		return nil, nil, remote, fmt.Errorf("%w: object of %d bytes, %d published", tensor.ErrTooSmall, pin.Len(), end)
	}
	if runs != nil {
		if err := fabric.CheckRuns(runs, end-start, spanBytes(dst.Desc)); err != nil {
			pin.Release()
			return nil, nil, remote, err
		}
	} else if end-start != spanBytes(dst.Desc) {
		pin.Release()
		return nil, nil, remote, fmt.Errorf("%w: pushing %d bytes into a slot of %d", tensor.ErrTooSmall, end-start, spanBytes(dst.Desc))
	}
	remote = r.remoteFor(dst)
	remote.Offset, remote.Length = 0, spanBytes(dst.Desc)
	return pin, &objstore.Window{Buffer: pin, Off: start, N: end - start}, remote, nil
}

func spanBytes(d tensor.Desc) int64 {
	start, end := d.Span()
	return end - start
}

// handlePush answers the push notices of one stream (notices.Serve): a
// push, a push batch (pushbatch.go) or a broadcast's message (bcastwire.go).
func (r *Runtime) handlePush(s network.Stream) {
	notices.Serve(s, func(from peer.ID, p []byte) []byte {
		var err error
		switch {
		case len(p) > 0 && p[0] == ctlwire.PushBatch:
			r.sinks.Notices.Add(1)
			n, err := ctlwire.ParsePushBatchNotice(p)
			if err != nil {
				r.log.Debug("push batch notice refused", "peer", shortID(from), "err", err)
				return []byte{ctlwire.StatusRefused}
			}
			r.sinks.Noticed.Add(int64(len(n.Items)))
			return ctlwire.AnswerPushBatch(r.sinks.PushedBatch(from, n))
		case len(p) > 0 && p[0] != ctlwire.Push:
			var m bcastrun.Msg
			if m, err = bcastrun.ParseMsg(p); err == nil {
				err = r.onBcast(from, m)
			}
		default:
			var n ctlwire.PushNotice
			r.sinks.Notices.Add(1)
			r.sinks.Noticed.Add(1)
			if n, err = ctlwire.ParsePushNotice(p); err == nil {
				err = r.sinks.Pushed(from, n)
			}
		}
		if err != nil {
			r.log.Debug("push notice refused", "peer", shortID(from), "err", err)
		}
		return []byte{ctlwire.StatusOf(err)}
	})
}
