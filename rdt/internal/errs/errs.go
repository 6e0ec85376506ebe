// Package errs holds the conditions of rdt and of the packages behind it,
// so that rdt's machinery (rdt/internal/...) returns the very values rdt
// exports: rdt's ErrX is errs.X, and errors.Is matches either name. Those
// shared with the transports are fabric's values, as in rdt.
//
// A new condition is added here, exported from rdt (rdt/errors.go), and
// given a kind in kinds.go.
package errs

import (
	"errors"
	"fmt"
	"net"

	"github.com/tensorlane/tensorlane/fabric"
)

// rdt's own conditions; rdt/errors.go documents each under its exported name.
var (
	MalformedRef     = errors.New("rdt: malformed ref")
	LayoutMismatch   = fmt.Errorf("%w: layout differs from the one its owner published", MalformedRef)
	MalformedAddr    = errors.New("rdt: malformed address")
	UnknownActor     = errors.New("rdt: unknown actor")
	UnknownDevice    = errors.New("rdt: device not available")
	NotOwner         = errors.New("rdt: only the owner may do this")
	Closed           = fmt.Errorf("rdt: runtime shut down: %w", net.ErrClosed)
	OwnerDied        = errors.New("rdt: owner died")
	PeerUnreachable  = errors.New("rdt: peer unreachable on the control channel")
	ReaderDied       = errors.New("rdt: reader died")
	BroadcastAborted = errors.New("rdt: broadcast aborted")
	NoZeroCopy       = errors.New("rdt: no zero-copy path to the object")
	InvalidArgument  = errors.New("invalid argument")
	DeviceClaimed    = errors.New("rdt: device claimed by another process")
	DeliveryUnknown  = errors.New("rdt: message sent, delivery unknown")
)

// ChunkHeld answers a probe for a broadcast chunk the slot has already:
// its new feeder skips it. It is no condition of rdt's API.
var ChunkHeld = errors.New("rdt: the reader has this broadcast chunk already")

// The transports' conditions rdt reports as they are (the same values).
var (
	OwnerClosed    = fabric.ErrOwnerClosed
	ObjectNotFound = fabric.ErrObjectNotFound
	ObjectFreed    = fabric.ErrObjectFreed
	StaleRef       = fabric.ErrStaleRef
	Unauthorized   = fabric.ErrUnauthorized
	SlotBusy       = fabric.ErrSinkBusy
)
