package fabric

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/tensorlane/tensorlane/tensor"
)

// Conditions every transport reports the same way. Callers test them with
// errors.Is; rdt re-exports them.
var (
	ErrObjectNotFound = errors.New("fabric: object not found")
	ErrObjectFreed    = errors.New("fabric: object freed")
	ErrStaleRef       = errors.New("fabric: reference from an earlier incarnation of its owner")
	ErrUnauthorized   = errors.New("fabric: not authorized")
	ErrBadRequest     = errors.New("fabric: bad request")
	ErrCorrupt        = errors.New("fabric: data corrupt")
	ErrNoPath         = errors.New("fabric: no transport reaches the destination")
	ErrPeerClosed     = errors.New("fabric: peer closed the connection")
	ErrStalled        = errors.New("fabric: transfer stalled")
	ErrClosed         = fmt.Errorf("fabric: transport closed: %w", net.ErrClosed)
	// ErrOwnerClosed: the owner is shutting down and takes no new reads,
	// leases or pushes (those in flight finish within its grace period).
	ErrOwnerClosed = fmt.Errorf("fabric: owner is shutting down: %w", net.ErrClosed)
	// ErrSinkBusy: a push's sink takes no writes yet (its reader has not
	// said it is done with the generation it holds). Every path would be
	// refused alike, so it is terminal for this push; the writer waits for
	// the reader and pushes again.
	ErrSinkBusy = errors.New("fabric: sink busy: its reader is still consuming a generation")
)

// Terminal reports whether err would fail on any path, so falling back to
// another transport is pointless: the object is gone, the claim is refused,
// the caller gave up, or the destination cannot hold it.
func Terminal(err error) bool {
	for _, t := range []error{ErrObjectNotFound, ErrObjectFreed, ErrStaleRef, ErrUnauthorized,
		ErrBadRequest, ErrOwnerClosed, ErrSinkBusy, tensor.ErrOutOfMemory, tensor.ErrTooSmall, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// PathError records which transport failed and why.
type PathError struct {
	Transport string
	Attempt   int // 1 for the first try of this path
	Err       error
}

func (e *PathError) Error() string {
	if e.Attempt > 1 {
		return fmt.Sprintf("fabric: %s (try %d): %v", e.Transport, e.Attempt, e.Err)
	}
	return "fabric: " + e.Transport + ": " + e.Err.Error()
}
func (e *PathError) Unwrap() error { return e.Err }
