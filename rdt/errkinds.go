package rdt

//go:generate go run ./internal/errgen -root ..

import "github.com/tensorlane/tensorlane/rdt/internal/errs"

// ErrInvalidArgument is a caller's mistake that no other kind names: an
// unknown handle, a bad dtype, a region that does not hold the tensor,
// malformed configuration. The C ABI and the worker report it.
var ErrInvalidArgument = errs.InvalidArgument

// Kind is one error kind: the name every layer uses for it (metrics, the
// worker protocol, the C ABI's TL_E_ constants, Python's exception classes),
// its code in the C ABI (stable: codes are never reused or renumbered), the
// sentinel errors it stands for (this package's ErrX values), and a line
// for people. The one table of kinds lives in rdt/internal/errs beside the
// conditions; `go generate ./rdt` writes the C header's enum and Python's
// table from it (rdt/internal/errgen), and a test checks that they agree.
type Kind = errs.Kind

// KindOther is the kind of an error that matched no sentinel (code 1): a
// bug in itself, since every failure should be typed.
const KindOther = errs.Other

// Kinds returns every error kind in code order, with "other" at code 1
// (code 0 is success). It is the table the C ABI, the worker and Python
// number and name their errors by.
func Kinds() []Kind { return errs.Kinds() }

// ErrorKind names the condition behind err: one of Kinds' names, or
// "other". Metrics, the dashboard, the worker protocol and the C ABI all
// use it.
func ErrorKind(err error) string { return errs.KindOf(err) }

// KindCode is err's kind as its C ABI code: 0 for nil, 1 for "other".
func KindCode(err error) int { return errs.CodeOf(err) }
