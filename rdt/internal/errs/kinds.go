package errs

import (
	"context"
	"errors"
	"slices"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Kind is one error kind: the name every layer uses for it (metrics, the
// worker protocol, the C ABI's TL_E_ constants, Python's exception classes),
// its code in the C ABI (stable: codes are never reused or renumbered), the
// sentinel errors it stands for, and a line for people. rdt exports it as
// rdt.Kind.
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
	{"invalid_argument", 2, []error{InvalidArgument, tensor.ErrBadDesc}, "the caller's mistake: a bad handle, dtype, shape, region or configuration"},
	{"owner_died", 3, []error{OwnerDied}, "the object's owner stopped answering while it was needed"},
	{"peer_unreachable", 4, []error{PeerUnreachable}, "the owner could not be reached on the control channel"},
	{"object_not_found", 5, []error{fabric.ErrObjectNotFound}, "the owner has no such object (or no such operation)"},
	{"object_freed", 6, []error{fabric.ErrObjectFreed}, "the object was freed by its owner"},
	{"stale_ref", 7, []error{fabric.ErrStaleRef}, "the ref names an earlier life of a restarted owner"},
	{"unauthorized", 8, []error{fabric.ErrUnauthorized}, "the peer or the capability was refused"},
	{"layout_mismatch", 22, []error{LayoutMismatch}, "the ref's layout is not the one its owner published (forged or corrupted)"},
	{"malformed_ref", 9, []error{MalformedRef}, "the ref's bytes do not parse"},
	{"out_of_memory", 10, []error{tensor.ErrOutOfMemory}, "the destination device has no room"},
	{"too_small", 11, []error{tensor.ErrTooSmall}, "a buffer is smaller than the data it must hold"},
	{"no_path", 12, []error{fabric.ErrNoPath}, "no transport connects the two endpoints"},
	{"unknown_device", 13, []error{UnknownDevice}, "the device is not one this runtime serves"},
	{"reader_died", 24, []error{ReaderDied}, "a reader of a push or broadcast died before it got, or said done with, its generation"},
	{"slot_busy", 25, []error{fabric.ErrSinkBusy}, "the slot's reader has not said done with its last generation, so it takes no new one yet"},
	{"broadcast_aborted", 26, []error{BroadcastAborted}, "the broadcast filling a slot ended without completing it"},
	{"no_zero_copy", 23, []error{NoZeroCopy}, "no path maps the object here (another host, or shm not allowed): copy instead"},
	{"not_owner", 27, []error{NotOwner}, "only the object's owner may do this"},
	{"unknown_actor", 28, []error{UnknownActor}, "no actor of that name"},
	{"corrupt", 14, []error{fabric.ErrCorrupt}, "the bytes failed their integrity check"},
	{"stalled", 15, []error{fabric.ErrStalled}, "the transfer made no progress for the stall timeout"},
	{"peer_closed", 16, []error{fabric.ErrPeerClosed}, "the peer closed the connection mid-transfer"},
	{"bad_request", 17, []error{fabric.ErrBadRequest}, "the peer refused a malformed request"},
	{"owner_closed", 21, []error{fabric.ErrOwnerClosed}, "the owner is shutting down"},
	{"closed", 18, []error{Closed, fabric.ErrClosed}, "this runtime (or handle) is closed"},
	{"timeout", 19, []error{context.DeadlineExceeded}, "the deadline passed"},
	{"canceled", 20, []error{context.Canceled}, "the caller canceled"},
}

// Other is the kind of an error that matched no sentinel (code 1).
const Other = "other"

// Kinds returns every error kind in code order, with Other at code 1
// (code 0 is success), each a copy.
func Kinds() []Kind {
	out := append([]Kind{{Other, 1, nil, "an error with no more specific kind"}}, kinds...)
	for i := range out {
		out[i].Errs = slices.Clone(out[i].Errs)
	}
	slices.SortFunc(out, func(a, b Kind) int { return a.Code - b.Code })
	return out
}

// KindOf names the condition behind err: a kind's name, Other for an
// untyped error, "" for nil.
func KindOf(err error) string {
	if err == nil {
		return ""
	}
	if k := kindOf(err); k != nil {
		return k.Name
	}
	return Other
}

// CodeOf is err's kind as its C ABI code: 0 for nil, 1 for Other.
func CodeOf(err error) int {
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
