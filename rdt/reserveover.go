package rdt

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/tensor"
)

// ReserveOver makes a slot over memory the reader already owns (its
// model's parameters), so pushes and broadcasts land in place instead of
// in a buffer the reader then copies from. buf must hold exactly desc's
// span on one of the actor's devices; the slot owns buf from now on and
// releases it at Close (lend memory you keep with a buffer whose Release
// does nothing). Whether same-host paths can write into buf depends on
// buf: shareable memory (tensor.Exportable) takes shm and p2p pushes,
// other memory only network ones (tcp, rdma), which write its bytes.
func (a *Actor) ReserveOver(ctx context.Context, buf tensor.Buffer, desc tensor.Desc, opts ...SlotOption) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a.rt.isClosed() {
		return nil, ErrClosed
	}
	if buf == nil {
		return nil, fmt.Errorf("%w: no buffer to reserve over", tensor.ErrBadDesc)
	}
	if err := a.mayUse(buf.Device()); err != nil {
		return nil, err
	}
	if err := desc.Validate(); err != nil {
		return nil, err
	}
	// A push notice carries the bytes written, checked against the
	// buffer's length: a buffer larger than the span would refuse them all.
	if n := spanBytes(desc); n != buf.Len() {
		return nil, fmt.Errorf("%w: %v spans %d bytes, the buffer holds %d", tensor.ErrTooSmall, desc, n, buf.Len())
	}
	return a.addSlot(buf, desc, opts), nil
}

// Done is closed when the runtime has shut down, so that layers holding
// the runtime's slots or operations (the C ABI's) can let go of them then.
func (r *Runtime) Done() <-chan struct{} { return r.done }
