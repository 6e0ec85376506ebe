package rdt

//go:generate go run ./internal/errgen -root ..

import (
	"context"
	"errors"
	"slices"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// ErrInvalidArgument is a caller's mistake that no other kind names: an
// unknown handle, a bad dtype, a region that does not hold the tensor,
// malformed configuration. The C ABI and the worker report it.
var ErrInvalidArgument = errs.InvalidArgument

// Kind is one error kind: the name every layer uses for it (metrics, the
// worker protocol, the C ABI's TL_E_ constants, Python's exception classes),
// its code in the C ABI (stable: codes are never reused or renumbered), the
// sentinel errors it stands for, and a line for people.
type Kind struct {
	Name string
	Code int
	Errs []error
	Doc  string
}

// kinds is the one list of error kinds, in matching order: the first kind
// whose sentinel an error wraps names it, so a condition that wraps a more
// general one (owner_closed wraps closed, layout_mismatch wraps
// malformed_ref) comes first. Codes 0 (success) and 1 ("other") are not
// kinds of an error that matched; new kinds take the next free code.
// `go generate ./rdt` writes the C header's enum and Python's table from it
// (rdt/internal/errgen); a test checks that they agree.
var kinds = []Kind{
	// First: a caller's bad layout says so even when the refusal also
	// wraps a transport's condition.
	{"invalid_argument", 2, []error{ErrInvalidArgument, tensor.ErrBadDesc}, "the caller's mistake: a bad handle, dtype, shape, region or configuration"},
	{"owner_died", 3, []error{ErrOwnerDied}, "the object's owner stopped answering while it was needed"},
	{"peer_unreachable", 4, []error{ErrPeerUnreachable}, "the owner could not be reached on the control channel"},
	{"object_not_found", 5, []error{ErrObjectNotFound}, "the owner has no such object (or no such operation)"},
	{"object_freed", 6, []error{ErrObjectFreed}, "the object was freed by its owner"},
	{"stale_ref", 7, []error{ErrStaleRef}, "the ref names an earlier life of a restarted owner"},
	{"unauthorized", 8, []error{ErrUnauthorized}, "the peer or the capability was refused"},
	{"layout_mismatch", 22, []error{ErrLayoutMismatch}, "the ref's layout is not the one its owner published (forged or corrupted)"},
	{"malformed_ref", 9, []error{ErrMalformedRef}, "the ref's bytes do not parse"},
	{"out_of_memory", 10, []error{ErrOutOfMemory}, "the destination device has no room"},
	{"too_small", 11, []error{ErrTooSmall}, "a buffer is smaller than the data it must hold"},
	{"no_path", 12, []error{ErrNoPath}, "no transport connects the two endpoints"},
	{"unknown_device", 13, []error{ErrUnknownDevice}, "the device is not one this runtime serves"},
	{"reader_died", 24, []error{ErrReaderDied}, "a reader of a push or broadcast died before it got, or said done with, its generation"},
	{"slot_busy", 25, []error{ErrSlotBusy}, "the slot's reader has not said done with its last generation, so it takes no new one yet"},
	{"broadcast_aborted", 26, []error{ErrBroadcastAborted}, "the broadcast filling a slot ended without completing it"},
	{"no_zero_copy", 23, []error{ErrNoZeroCopy}, "no path maps the object here (another host, or shm not allowed): copy instead"},
	{"not_owner", 27, []error{ErrNotOwner}, "only the object's owner may do this"},
	{"unknown_actor", 28, []error{ErrUnknownActor}, "no actor of that name"},
	{"corrupt", 14, []error{fabric.ErrCorrupt}, "the bytes failed their integrity check"},
	{"stalled", 15, []error{fabric.ErrStalled}, "the transfer made no progress for the stall timeout"},
	{"peer_closed", 16, []error{fabric.ErrPeerClosed}, "the peer closed the connection mid-transfer"},
	{"bad_request", 17, []error{fabric.ErrBadRequest}, "the peer refused a malformed request"},
	{"owner_closed", 21, []error{ErrOwnerClosed}, "the owner is shutting down"},
	{"closed", 18, []error{ErrClosed, fabric.ErrClosed}, "this runtime (or handle) is closed"},
	{"timeout", 19, []error{context.DeadlineExceeded}, "the deadline passed"},
	{"canceled", 20, []error{context.Canceled}, "the caller canceled"},
}

// KindOther is the kind of an error that matched no sentinel (code 1): a
// bug in itself, since every failure should be typed.
const KindOther = "other"

// Kinds returns every error kind in code order, with "other" at code 1
// (code 0 is success). It is the table the C ABI, the worker and Python
// number and name their errors by.
func Kinds() []Kind {
	out := append([]Kind{{KindOther, 1, nil, "an error with no more specific kind"}}, kinds...)
	for i := range out {
		out[i].Errs = slices.Clone(out[i].Errs)
	}
	slices.SortFunc(out, func(a, b Kind) int { return a.Code - b.Code })
	return out
}

// ErrorKind names the condition behind err: one of Kinds' names, or
// "other". Metrics, the dashboard, the worker protocol and the C ABI all
// use it.
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	if k := kindOf(err); k != nil {
		return k.Name
	}
	return KindOther
}

// KindCode is err's kind as its C ABI code: 0 for nil, 1 for "other".
func KindCode(err error) int {
	if err == nil {
		return 0
	}
	if k := kindOf(err); k != nil {
		return k.Code
	}
	return 1
}

// kindOf is the first kind, in matching order, whose sentinel err wraps.
func kindOf(err error) *Kind {
	for i := range kinds {
		for _, e := range kinds[i].Errs {
			if errors.Is(err, e) {
				return &kinds[i]
			}
		}
	}
	return nil
}
