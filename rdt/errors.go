package rdt

import (
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Conditions callers test with errors.Is. Those shared with the transports
// are the same values as in fabric, so either name matches; rdt's own are
// defined in rdt/internal/errs, so that the packages behind rdt return the
// very values exported here.
var (
	ErrMalformedRef = errs.MalformedRef
	// ErrLayoutMismatch: the ref's desc (shape, strides, dtype, offset) is
	// not the one its owner published, as a forged or corrupted ref's. The
	// reader learns it from the owner before it allocates anything. It
	// matches ErrMalformedRef too.
	ErrLayoutMismatch = errs.LayoutMismatch
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
	ErrUnknownActor   = errs.UnknownActor
	ErrUnknownDevice  = errs.UnknownDevice
	ErrNotOwner       = errs.NotOwner
	ErrClosed         = errs.Closed // wraps net.ErrClosed
	// ErrTransferStalled is fabric.ErrStalled: a transfer made no progress
	// for Config.StallTimeout.
	ErrTransferStalled = fabric.ErrStalled
	// ErrOwnerDied: the owner incarnation named by the ref stopped
	// answering (its connection was lost and could not be re-established,
	// or it missed Config.HeartbeatMisses heartbeats) while the caller
	// needed it.
	ErrOwnerDied = errs.OwnerDied
	// ErrPeerUnreachable: the control channel to a peer could not be
	// opened (not running, not a member of the cluster, or not admitted).
	ErrPeerUnreachable = errs.PeerUnreachable
)

// Broadcast and flow-control conditions.
var (
	// ErrSlotBusy: the slot's reader has not said Done with the
	// generation it holds, so the slot takes no writes yet. It is
	// fabric.ErrSinkBusy, so a writer on any path learns it as such.
	ErrSlotBusy = fabric.ErrSinkBusy
	// ErrReaderDied: a broadcast reader's runtime was declared dead.
	ErrReaderDied = errs.ReaderDied
	// ErrBroadcastAborted: the broadcast filling a slot ended without
	// completing it (its owner gave up, or a newer one replaced it).
	ErrBroadcastAborted = errs.BroadcastAborted
)

// ErrBadRuns: a push's runs (PushRuns) do not describe it: a run outside
// the source object's bytes or of no bytes, an overflowing range, or runs
// whose lengths do not add up to the slot's. It is fabric.ErrBadRuns and
// matches fabric.ErrBadRequest.
var ErrBadRuns = fabric.ErrBadRuns
