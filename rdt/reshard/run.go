package reshard

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Key names a move by its source and destination shard.
type Key struct{ Src, Dst int }

// Sender is a source shard's side of a plan: one pack buffer per outgoing
// move, published once and pushed every step.
type Sender struct {
	a     *rdt.Actor
	plan  *Plan
	shard int
	moves []Move
	refs  []rdt.Ref
	packs [][]byte
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

// Send packs this step's bytes of the shard (src, row-major, the shard's
// size) and pushes every move into its destination's slot at once (one
// PushBatch: coalesced per path and destination). slots are the
// receivers' (Receiver.Slots, merged). The error joins each move's.
func (s *Sender) Send(ctx context.Context, src []byte, slots map[Key]rdt.Ref) ([]rdt.Transfer, error) {
	if int64(len(src)) != s.plan.From.Bytes(s.shard) {
		return nil, fmt.Errorf("%w: source shard %d holds %d bytes, not %d", tensor.ErrTooSmall, s.shard, s.plan.From.Bytes(s.shard), len(src))
	}
	dsts := make([]rdt.Ref, len(s.moves))
	for i, m := range s.moves {
		d, ok := slots[Key{m.Src, m.Dst}]
		if !ok {
			return nil, fmt.Errorf("%w: no slot for the move from %d to %d", ErrLayout, m.Src, m.Dst)
		}
		dsts[i] = d
		m.Pack(s.packs[i], src)
	}
	if len(s.moves) == 0 {
		return nil, nil
	}
	xs, errs := s.a.PushBatch(ctx, s.refs, dsts, rdt.BatchConfig{})
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("move %d -> %d: %w", s.moves[i].Src, s.moves[i].Dst, err)
		}
	}
	return xs, errors.Join(errs...)
}

// Close frees the pack buffers. Idempotent.
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
}

// NewReceiver reserves shard's slots of p on actor a (host memory).
func NewReceiver(ctx context.Context, a *rdt.Actor, p *Plan, shard int) (*Receiver, error) {
	if a == nil || p == nil {
		return nil, fmt.Errorf("%w: no actor or plan", ErrLayout)
	}
	if shard < 0 || shard >= len(p.To.Shards) {
		return nil, fmt.Errorf("%w: destination shard %d of %d", ErrLayout, shard, len(p.To.Shards))
	}
	r := &Receiver{plan: p, shard: shard, moves: p.Into(shard)}
	for _, m := range r.moves {
		s, err := a.Reserve(ctx, tensor.NewDesc(tensor.Uint8, m.Bytes), tensor.HostDevice, rdt.WithGenerations())
		if err != nil {
			r.Close()
			return nil, err
		}
		r.slots = append(r.slots, s)
	}
	return r, nil
}

// Slots are the receiver's slot refs by move, for the senders.
func (r *Receiver) Slots() map[Key]rdt.Ref {
	out := make(map[Key]rdt.Ref, len(r.moves))
	for i, m := range r.moves {
		out[Key{m.Src, m.Dst}] = r.slots[i].Ref()
	}
	return out
}

// Receive waits until every incoming move of the next step has landed,
// scatters them into dst (the destination shard, row-major, its size) and
// tells the senders it is done, so the step after can land. On an error
// dst is unchanged.
func (r *Receiver) Receive(ctx context.Context, dst []byte) error {
	if int64(len(dst)) != r.plan.To.Bytes(r.shard) {
		return fmt.Errorf("%w: destination shard %d holds %d bytes, not %d", tensor.ErrTooSmall, r.shard, r.plan.To.Bytes(r.shard), len(dst))
	}
	views := make([][]byte, len(r.slots))
	gens := make([]uint64, len(r.slots))
	for i, s := range r.slots {
		g, t, err := s.Wait(ctx, r.gen)
		if err != nil {
			return fmt.Errorf("move %d -> %d: %w", r.moves[i].Src, r.moves[i].Dst, err)
		}
		b, err := tensor.BytesOf(t.Buffer())
		if err != nil {
			return err
		}
		views[i], gens[i] = b, g
	}
	for i, m := range r.moves {
		m.Unpack(dst, views[i])
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
