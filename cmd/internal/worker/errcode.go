package worker

import (
	"errors"

	"github.com/tensorlane/tensorlane/rdt"
)

// ErrorCode names the typed condition behind err, for drivers in other
// processes and for the soak's tallies: rdt.ErrorKind's names (one table
// for every layer), with the worker's own verification failure as
// "corrupt" and its request errors as "bad_request". "other" means the
// error matched no sentinel: a bug in itself, since every failure should
// be typed.
func ErrorCode(err error) string {
	switch {
	case errors.Is(err, errVerify):
		return "corrupt"
	case errors.Is(err, errBadWorkerRequest):
		return "bad_request"
	}
	return rdt.ErrorKind(err)
}
