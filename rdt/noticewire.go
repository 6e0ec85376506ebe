package rdt

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// The push-notice protocol (pushProtocol, on the streams of notices.go):
// every message starts with its kind, and every message is answered with
// one status byte (a push batch may add one status per item). The kinds
// and statuses are one table, in package ctlwire; this file maps the
// statuses to the conditions they carry. push.go, pushbatch.go and bcastwire.go encode and
// decode the bodies.

// noticeStatuses maps each status (but OK, Refused and Items) to the
// condition it carries, both ways.
var noticeStatuses = []struct {
	status byte
	err    error
}{
	{ctlwire.StatusNotFound, ErrObjectNotFound},
	{ctlwire.StatusUnauthorized, ErrUnauthorized},
	{ctlwire.StatusStale, ErrStaleRef},
	{ctlwire.StatusBusy, ErrSlotBusy},
	{ctlwire.StatusHave, errChunkHeld},
}

// errChunkHeld answers a probe for a chunk the slot has already: its new
// feeder skips it. (A reader of an older version refuses the probe as a
// malformed notice, and the feeder writes the chunk as before.)
var errChunkHeld = errors.New("rdt: the reader has this broadcast chunk already")

// noticeStatus is the status byte a notice is answered with.
func noticeStatus(err error) byte {
	if err == nil {
		return ctlwire.StatusOK
	}
	for _, s := range noticeStatuses {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return ctlwire.StatusRefused
}

// noticeError is the condition a status byte reports.
func noticeError(status byte) error {
	if status == ctlwire.StatusOK {
		return nil
	}
	for _, s := range noticeStatuses {
		if s.status == status {
			return s.err
		}
	}
	return fmt.Errorf("%w: notice refused (status %d)", ErrMalformedRef, status)
}
