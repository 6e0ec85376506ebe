package rdt

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
)

// The notice protocol's bytes are a wire format: golden values, and every
// status names its condition both ways.
func TestNoticeWireTable(t *testing.T) {
	kinds := []byte{ctlwire.Push, ctlwire.Chunk, ctlwire.Prepare, ctlwire.Children, ctlwire.Report, ctlwire.Consumed, ctlwire.Abort, ctlwire.Probe, ctlwire.PushBatch}
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7, 8, 16}, kinds)
	statuses := []byte{ctlwire.StatusOK, ctlwire.StatusNotFound, ctlwire.StatusUnauthorized, ctlwire.StatusStale, ctlwire.StatusRefused, ctlwire.StatusBusy, ctlwire.StatusItems, ctlwire.StatusHave}
	assert.Equal(t, []byte{0, 1, 2, 3, 4, 5, 6, 7}, statuses)

	for _, s := range noticeStatuses {
		wrapped := fmt.Errorf("context: %w", s.err)
		assert.Equal(t, s.status, noticeStatus(wrapped))
		assert.True(t, errors.Is(noticeError(s.status), s.err))
	}
	assert.Equal(t, ctlwire.StatusOK, noticeStatus(nil))
	assert.NoError(t, noticeError(ctlwire.StatusOK))
	assert.Equal(t, ctlwire.StatusRefused, noticeStatus(errors.New("anything else")))
	assert.ErrorIs(t, noticeError(ctlwire.StatusRefused), ErrMalformedRef)
	assert.ErrorIs(t, noticeError(200), ErrMalformedRef)
}
