package rdt

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The notice protocol's bytes are a wire format: golden values, and every
// status names its condition both ways.
func TestNoticeWireTable(t *testing.T) {
	kinds := []byte{notePush, noteChunk, notePrepare, noteChildren, noteReport, noteConsumed, noteAbort, noteProbe, notePushBatch}
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7, 8, 16}, kinds)
	statuses := []byte{statusOK, statusNotFound, statusUnauthorized, statusStale, statusRefused, statusBusy, statusItems, statusHave}
	assert.Equal(t, []byte{0, 1, 2, 3, 4, 5, 6, 7}, statuses)

	for _, s := range noticeStatuses {
		wrapped := fmt.Errorf("context: %w", s.err)
		assert.Equal(t, s.status, noticeStatus(wrapped))
		assert.True(t, errors.Is(noticeError(s.status), s.err))
	}
	assert.Equal(t, statusOK, noticeStatus(nil))
	assert.NoError(t, noticeError(statusOK))
	assert.Equal(t, statusRefused, noticeStatus(errors.New("anything else")))
	assert.ErrorIs(t, noticeError(statusRefused), ErrMalformedRef)
	assert.ErrorIs(t, noticeError(200), ErrMalformedRef)
}
