package reshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Key names a move by its source and destination shard.
type Key struct{ Src, Dst int }

// Sender is a source shard's side of a plan: made over the shard's rdt
// object (NewSenderOver), the runs of each outgoing move pushed from it;
// else (NewSender) one pack buffer per outgoing move, published once and
// pushed every step.
type Sender struct {
	a     *rdt.Actor
	plan  *Plan
	shard int
	moves []Move
	refs  []rdt.Ref
	packs [][]byte
	// over is the shard's object of NewSenderOver (runs[i]: move i's
	// ranges of it); nil: NewSender.
	over *rdt.Ref
	runs [][]rdt.Run
}

// NewSenderOver prepares shard's side of p on actor a for a shard that is
// the rdt object src for good (Put by a's runtime, the shard's bytes,
// row-major, updated in place between steps): each Send pushes every move's
// strided runs straight from it (rdt.PushRuns), with no pack buffer and no
// copy where the path sends runs (tcp, rdma, shm; a path that cannot packs them
// into staging memory, logged and counted in tensorlane_gather_packed_total).
// The sender does not own src: Close leaves it alone.
func NewSenderOver(ctx context.Context, a *rdt.Actor, p *Plan, shard int, src rdt.Ref) (*Sender, error) {
	if a == nil || p == nil {
		return nil, fmt.Errorf("%w: no actor or plan", ErrLayout)
	}
	if shard < 0 || shard >= len(p.From.Shards) {
		return nil, fmt.Errorf("%w: source shard %d of %d", ErrLayout, shard, len(p.From.Shards))
	}
	if start, end := src.Desc.Span(); end-start != p.From.Bytes(shard) {
		return nil, fmt.Errorf("%w: source shard %d holds %d bytes, its object %d", tensor.ErrTooSmall, shard, p.From.Bytes(shard), end-start)
	}
	s := &Sender{a: a, plan: p, shard: shard, moves: p.FromShard(shard), over: &src}
	for _, m := range s.moves {
		s.runs = append(s.runs, m.SrcRuns())
	}
	return s, nil
}

// NewSender prepares shard's side of p on actor a: it allocates and
// publishes one host buffer per move out of the shard.
func NewSender(ctx context.Context, a *rdt.Actor, p *Plan, shard int) (*Sender, error) {
	if a == nil || p == nil {
		return nil, fmt.Errorf("%w: no actor or plan", ErrLayout)
	}
	if shard < 0 || shard >= len(p.From.Shards) {
		return nil, fmt.Errorf("%w: source shard %d of %d", ErrLayout, shard, len(p.From.Shards))
	}
	mem, err := a.Runtime().Memory(tensor.HostDevice)
	if err != nil {
		return nil, err
	}
	s := &Sender{a: a, plan: p, shard: shard, moves: p.FromShard(shard)}
	for _, m := range s.moves {
		buf, err := mem.Alloc(ctx, m.Bytes)
		if err != nil {
			s.Close(ctx)
			return nil, err
		}
		b, err := tensor.BytesOf(buf)
		if err == nil {
			var t tensor.Tensor
			if t, err = tensor.New(buf, tensor.NewDesc(tensor.Uint8, m.Bytes)); err == nil {
				var ref rdt.Ref
				if ref, err = a.Put(ctx, t); err == nil {
					s.refs, s.packs = append(s.refs, ref), append(s.packs, b)
					continue
				}
			}
		}
		buf.Release()
		s.Close(ctx)
		return nil, err
	}
	return s, nil
}

// Moves are the sender's moves, one per destination shard it feeds.
func (s *Sender) Moves() []Move { return s.moves }

// Send pushes every move of this step's shard into its destination's slot,
// all at once (every move goes to another destination shard, so a push
// batch would coalesce nothing). A sender made over the shard's object
// (NewSenderOver) sends its runs straight from it: src must be nil. Else
// src is the shard's bytes (row-major, its size), packed move by move, each
// move's push starting as soon as it is packed so the packing of the next
// overlaps the wire. slots are the receivers' (Receiver.Slots, merged). The
// transfers come in the order of Moves; the error joins each move's.
func (s *Sender) Send(ctx context.Context, src []byte, slots map[Key]rdt.Ref) ([]rdt.Transfer, error) {
	if s.over != nil && src != nil {
		return nil, fmt.Errorf("%w: source shard %d: the sender sends from its object, not from other memory", ErrLayout, s.shard)
	}
	if s.over == nil && int64(len(src)) != s.plan.From.Bytes(s.shard) {
		return nil, fmt.Errorf("%w: source shard %d holds %d bytes, not %d", tensor.ErrTooSmall, s.shard, s.plan.From.Bytes(s.shard), len(src))
	}
	dsts := make([]rdt.Ref, len(s.moves))
	for i, m := range s.moves {
		d, ok := slots[Key{m.Src, m.Dst}]
		if !ok {
			return nil, fmt.Errorf("%w: no slot for the move from %d to %d", ErrLayout, m.Src, m.Dst)
		}
		dsts[i] = d
	}
	xs := make([]rdt.Transfer, len(s.moves))
	errs := make([]error, len(s.moves))
	var wg sync.WaitGroup
	for i, m := range s.moves {
		var from *rdt.Ref
		var opts []rdt.PushOption
		if s.over != nil {
			from, opts = s.over, []rdt.PushOption{rdt.PushRuns(s.runs[i])}
		} else {
			m.Pack(s.packs[i], src)
			from = &s.refs[i]
		}
		wg.Go(func() {
			x, err := s.a.Push(ctx, *from, dsts[i], opts...)
			xs[i] = x
			if err != nil {
				errs[i] = fmt.Errorf("move %d -> %d: %w", m.Src, m.Dst, err)
			}
		})
	}
	wg.Wait()
	if len(s.moves) == 0 {
		return nil, nil
	}
	return xs, errors.Join(errs...)
}

// Close frees the pack buffers (a sender made over an object has none).
// Idempotent.
func (s *Sender) Close(ctx context.Context) error {
	var errs []error
	for _, r := range s.refs {
		if err := s.a.Free(ctx, r); err != nil && !errors.Is(err, rdt.ErrObjectFreed) && !errors.Is(err, rdt.ErrObjectNotFound) {
			errs = append(errs, err)
		}
	}
	s.refs, s.packs = nil, nil
	return errors.Join(errs...)
}

// Receiver is a destination shard's side of a plan: one flow-controlled
// slot per incoming move.
type Receiver struct {
	plan  *Plan
	shard int
	moves []Move
	slots []*rdt.Slot
	gen   uint64
	// over is the shard's memory of NewReceiverOver (nil: NewReceiver);
	// inPlace[i] says move i lands in it (no scatter).
	over    []byte
	inPlace []bool
}

// NewReceiver reserves shard's slots of p on actor a (host memory).
func NewReceiver(ctx context.Context, a *rdt.Actor, p *Plan, shard int) (*Receiver, error) {
	return newReceiver(ctx, a, p, shard, nil)
}

// NewReceiverOver is NewReceiver for a shard whose memory is dst for good
// (every Receive passes it): each move whose block is one contiguous range
// of the shard (a row split feeding a column split, and any split along
// the first dimension) lands in dst itself, at its offset, so Receive has
// no copy to make for it; the other moves land in their own slots and are
// scattered as with NewReceiver. dst is memory the runtime cannot share:
// network paths (tcp, rdma) write it in place, and a sender on the same
// host reaches it over the network too (loudly), so use it for senders on
// other hosts. A move that lands in place writes dst while it arrives:
// after an error, dst may hold part of the step.
func NewReceiverOver(ctx context.Context, a *rdt.Actor, p *Plan, shard int, dst []byte) (*Receiver, error) {
	if p != nil && shard >= 0 && shard < len(p.To.Shards) && int64(len(dst)) != p.To.Bytes(shard) {
		return nil, fmt.Errorf("%w: destination shard %d holds %d bytes, not %d", tensor.ErrTooSmall, shard, p.To.Bytes(shard), len(dst))
	}
	if dst == nil {
		dst = []byte{}
	}
	return newReceiver(ctx, a, p, shard, dst)
}

func newReceiver(ctx context.Context, a *rdt.Actor, p *Plan, shard int, over []byte) (*Receiver, error) {
	if a == nil || p == nil {
		return nil, fmt.Errorf("%w: no actor or plan", ErrLayout)
	}
	if shard < 0 || shard >= len(p.To.Shards) {
		return nil, fmt.Errorf("%w: destination shard %d of %d", ErrLayout, shard, len(p.To.Shards))
	}
	r := &Receiver{plan: p, shard: shard, moves: p.Into(shard), over: over}
	for _, m := range r.moves {
		desc := tensor.NewDesc(tensor.Uint8, m.Bytes)
		var s *rdt.Slot
		var err error
		off, contiguous := m.dstRange()
		if over != nil && contiguous {
			// The slot owns the buffer it is made over and releases it
			// at Close; a foreign buffer's Release leaves the memory alone.
			s, err = a.ReserveOver(ctx, tensor.NewForeign(over[off:off+m.Bytes], tensor.ForeignConfig{}), desc, rdt.WithGenerations())
		} else {
			s, err = a.Reserve(ctx, desc, tensor.HostDevice, rdt.WithGenerations())
		}
		if err != nil {
			r.Close()
			return nil, err
		}
		r.slots, r.inPlace = append(r.slots, s), append(r.inPlace, over != nil && contiguous)
	}
	return r, nil
}

// InPlace says, per move of the receiver (in the order of Slots' moves,
// Plan.Into), whether it lands in the shard's memory itself.
func (r *Receiver) InPlace() []bool { return slices.Clone(r.inPlace) }

// Slots are the receiver's slot refs by move, for the senders.
func (r *Receiver) Slots() map[Key]rdt.Ref {
	out := make(map[Key]rdt.Ref, len(r.moves))
	for i, m := range r.moves {
		out[Key{m.Src, m.Dst}] = r.slots[i].Ref()
	}
	return out
}

// Receive waits until every incoming move of the next step has landed,
// scatters those that did not land in place into dst (the destination
// shard, row-major, its size; for NewReceiverOver, the memory it was made
// over) and tells the senders it is done, so the step after can land. On
// an error dst is unchanged, but for moves that land in place (see
// NewReceiverOver).
func (r *Receiver) Receive(ctx context.Context, dst []byte) error {
	if int64(len(dst)) != r.plan.To.Bytes(r.shard) {
		return fmt.Errorf("%w: destination shard %d holds %d bytes, not %d", tensor.ErrTooSmall, r.shard, r.plan.To.Bytes(r.shard), len(dst))
	}
	if r.over != nil && len(dst) > 0 && &dst[0] != &r.over[0] {
		return fmt.Errorf("%w: destination shard %d: not the memory the receiver was made over", ErrLayout, r.shard)
	}
	views := make([][]byte, len(r.slots))
	gens := make([]uint64, len(r.slots))
	for i, s := range r.slots {
		g, t, err := s.Wait(ctx, r.gen)
		if err != nil {
			return fmt.Errorf("move %d -> %d: %w", r.moves[i].Src, r.moves[i].Dst, err)
		}
		gens[i] = g
		if r.inPlace[i] {
			continue
		}
		b, err := tensor.BytesOf(t.Buffer())
		if err != nil {
			return err
		}
		views[i] = b
	}
	for i, m := range r.moves {
		if !r.inPlace[i] {
			m.Unpack(dst, views[i])
		}
	}
	var errs []error
	for i, s := range r.slots {
		errs = append(errs, s.Done(ctx, gens[i]))
	}
	r.gen = slices.Min(gens)
	return errors.Join(errs...)
}

// Close closes the slots. Idempotent.
func (r *Receiver) Close() error {
	var errs []error
	for _, s := range r.slots {
		errs = append(errs, s.Close())
	}
	r.slots = nil
	return errors.Join(errs...)
}

// dstRange is the move's offset in the destination shard and whether its
// bytes lie there as one contiguous range, in the order Pack writes them.
func (m Move) dstRange() (int64, bool) {
	if len(m.Runs) == 0 {
		return 0, false
	}
	off := m.Runs[0].DstOff
	at := off
	for _, r := range m.Runs {
		if r.DstOff != at || (r.Count > 1 && r.DstStride != r.Len) {
			return 0, false
		}
		at += r.Count * r.Len
	}
	return off, at-off == m.Bytes
}
