package rdt

import (
	"errors"
	"fmt"
)

// The push-notice protocol (pushProtocol, on the streams of notices.go):
// every message starts with its kind, and every message is answered with
// one status byte (a push batch may add one status per item). This file is
// the one table of both; push.go, pushbatch.go and bcastwire.go encode and
// decode the bodies.

// Notice kinds: the first byte of a notice.
const (
	notePush      byte = 1  // owner → slot runtime: a push into your slot completed (push.go)
	noteChunk     byte = 2  // parent → reader: bytes [off, off+n) of broadcast id landed in your slot
	notePrepare   byte = 3  // owner → reader: broadcast id of n bytes in chunks of chunk is coming
	noteChildren  byte = 4  // owner → reader: forward what lands to these slots
	noteReport    byte = 5  // reader → owner: slot complete (gen), or a child failed (failed, text)
	noteConsumed  byte = 6  // reader → writer: done with generation gen of slot
	noteAbort     byte = 7  // owner → reader: broadcast id ends without you
	noteProbe     byte = 8  // feeder → re-parented reader: do you lack chunk [off, off+n)? (answered 0, or statusHave)
	notePushBatch byte = 16 // owner → slot runtime: many pushes completed (pushbatch.go)
)

// Notice statuses: the answer's first byte.
const (
	statusOK           byte = 0
	statusNotFound     byte = 1
	statusUnauthorized byte = 2
	statusStale        byte = 3
	statusRefused      byte = 4 // malformed, or refused for a reason no other status names
	statusBusy         byte = 5
	statusItems        byte = 6 // push batch: count status bytes follow, one per item
	statusHave         byte = 7 // probe: the slot has that chunk already
)

// noticeStatuses maps each status (but OK, Refused and Items) to the
// condition it carries, both ways.
var noticeStatuses = []struct {
	status byte
	err    error
}{
	{statusNotFound, ErrObjectNotFound},
	{statusUnauthorized, ErrUnauthorized},
	{statusStale, ErrStaleRef},
	{statusBusy, ErrSlotBusy},
	{statusHave, errChunkHeld},
}

// errChunkHeld answers a probe for a chunk the slot has already: its new
// feeder skips it. (A reader of an older version refuses the probe as a
// malformed notice, and the feeder writes the chunk as before.)
var errChunkHeld = errors.New("rdt: the reader has this broadcast chunk already")

// noticeStatus is the status byte a notice is answered with.
func noticeStatus(err error) byte {
	if err == nil {
		return statusOK
	}
	for _, s := range noticeStatuses {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return statusRefused
}

// noticeError is the condition a status byte reports.
func noticeError(status byte) error {
	if status == statusOK {
		return nil
	}
	for _, s := range noticeStatuses {
		if s.status == status {
			return s.err
		}
	}
	return fmt.Errorf("%w: notice refused (status %d)", ErrMalformedRef, status)
}
