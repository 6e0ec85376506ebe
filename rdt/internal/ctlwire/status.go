package ctlwire

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// statusErrs maps each status (but OK, Refused and Items) to the condition
// it carries, both ways.
var statusErrs = []struct {
	status byte
	err    error
}{
	{StatusNotFound, errs.ObjectNotFound},
	{StatusUnauthorized, errs.Unauthorized},
	{StatusStale, errs.StaleRef},
	{StatusBusy, errs.SlotBusy},
	{StatusHave, errs.ChunkHeld},
}

// StatusOf is the status byte a notice that ended in err is answered with.
func StatusOf(err error) byte {
	if err == nil {
		return StatusOK
	}
	for _, s := range statusErrs {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return StatusRefused
}

// ErrOf is the condition a status byte reports (nil for StatusOK). A
// refusal, or a status this build does not know, is a malformed notice.
func ErrOf(status byte) error {
	if status == StatusOK {
		return nil
	}
	for _, s := range statusErrs {
		if s.status == status {
			return s.err
		}
	}
	return fmt.Errorf("%w: notice refused (status %d)", errs.MalformedRef, status)
}
