package rdt

import (
	"errors"
	"fmt"
	"net"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Conditions callers test with errors.Is. Those shared with the transports
// are the same values as in fabric, so either name matches.
var (
	ErrMalformedRef = errors.New("rdt: malformed ref")
	// ErrLayoutMismatch: the ref's desc (shape, strides, dtype, offset) is
	// not the one its owner published, as a forged or corrupted ref's. The
	// reader learns it from the owner before it allocates anything. It
	// matches ErrMalformedRef too.
	ErrLayoutMismatch = fmt.Errorf("%w: layout differs from the one its owner published", ErrMalformedRef)
	// ErrOwnerClosed: the owner is shutting down; it takes no new reads,
	// leases or pushes. The same value as fabric.ErrOwnerClosed; it wraps
	// net.ErrClosed.
	ErrOwnerClosed    = fabric.ErrOwnerClosed
	ErrObjectNotFound = fabric.ErrObjectNotFound
	ErrObjectFreed    = fabric.ErrObjectFreed
	ErrStaleRef       = fabric.ErrStaleRef
	ErrUnauthorized   = fabric.ErrUnauthorized
	ErrOutOfMemory    = tensor.ErrOutOfMemory
	ErrTooSmall       = tensor.ErrTooSmall
	ErrNoPath         = fabric.ErrNoPath
	ErrUnknownActor   = errors.New("rdt: unknown actor")
	ErrUnknownDevice  = errors.New("rdt: device not available")
	ErrNotOwner       = errors.New("rdt: only the owner may do this")
	ErrClosed         = fmt.Errorf("rdt: runtime shut down: %w", net.ErrClosed)
	// ErrTransferStalled is fabric.ErrStalled: a transfer made no progress
	// for Config.StallTimeout.
	ErrTransferStalled = fabric.ErrStalled
	// ErrOwnerDied: the owner incarnation named by the ref stopped
	// answering (its connection was lost and could not be re-established,
	// or it missed Config.HeartbeatMisses heartbeats) while the caller
	// needed it.
	ErrOwnerDied = errors.New("rdt: owner died")
	// ErrPeerUnreachable: the control channel to a peer could not be
	// opened (not running, not a member of the cluster, or not admitted).
	ErrPeerUnreachable = errors.New("rdt: peer unreachable on the control channel")
)

// Broadcast and flow-control conditions.
var (
	// ErrSlotBusy: the slot's reader has not said Done with the
	// generation it holds, so the slot takes no writes yet. It is
	// fabric.ErrSinkBusy, so a writer on any path learns it as such.
	ErrSlotBusy = fabric.ErrSinkBusy
	// ErrReaderDied: a broadcast reader's runtime was declared dead.
	ErrReaderDied = errors.New("rdt: reader died")
	// ErrBroadcastAborted: the broadcast filling a slot ended without
	// completing it (its owner gave up, or a newer one replaced it).
	ErrBroadcastAborted = errors.New("rdt: broadcast aborted")
)
