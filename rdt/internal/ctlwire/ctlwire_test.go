package ctlwire

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// The notice protocol's bytes are a wire format: golden values, and every
// status names its condition both ways.
func TestNoticeWireTable(t *testing.T) {
	kinds := []byte{Push, Chunk, Prepare, Children, Report, Consumed, Abort, Probe, PushBatch}
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7, 8, 16}, kinds)
	statuses := []byte{StatusOK, StatusNotFound, StatusUnauthorized, StatusStale, StatusRefused, StatusBusy, StatusItems, StatusHave}
	assert.Equal(t, []byte{0, 1, 2, 3, 4, 5, 6, 7}, statuses)

	for _, s := range statusErrs {
		wrapped := fmt.Errorf("context: %w", s.err)
		assert.Equal(t, s.status, StatusOf(wrapped))
		assert.True(t, errors.Is(ErrOf(s.status), s.err))
	}
	assert.Equal(t, StatusOK, StatusOf(nil))
	assert.NoError(t, ErrOf(StatusOK))
	assert.Equal(t, StatusRefused, StatusOf(errors.New("anything else")))
	assert.ErrorIs(t, ErrOf(StatusRefused), errs.MalformedRef)
	assert.ErrorIs(t, ErrOf(200), errs.MalformedRef)
}
