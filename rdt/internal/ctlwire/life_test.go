package ctlwire

import (
	"bytes"
	"crypto/rand"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

func TestLifeMsgEncoding(t *testing.T) {
	var obj fabric.ObjectID
	rand.Read(obj[:])
	tests := []LifeMsg{
		{Kind: LifePing, Incarnation: 7},
		{Kind: LifePong, Incarnation: 1<<64 - 1},
		{Kind: LifeLease, Incarnation: 3, Claims: []fabric.Claim{{Object: obj, Incarnation: 9, Token: bytes.Repeat([]byte{1}, 16)}, {Object: obj}}},
		{Kind: LifeRelease, Incarnation: 3, Claims: []fabric.Claim{{Object: obj, Incarnation: 9, Token: []byte{2}}}},
		{Kind: LifeLeased, Incarnation: 5, Statuses: []byte{LeaseOK, LeaseFreed}, TTL: 15 * time.Second},
	}
	for _, m := range tests {
		b := m.Marshal()
		back, err := ParseLifeMsg(b)
		require.NoError(t, err)
		assert.Equal(t, m.Kind, back.Kind)
		assert.Equal(t, m.Incarnation, back.Incarnation)
		assert.Equal(t, len(m.Claims), len(back.Claims))
		for i := range m.Claims {
			assert.Equal(t, m.Claims[i].Object, back.Claims[i].Object)
			assert.Equal(t, m.Claims[i].Incarnation, back.Claims[i].Incarnation)
			assert.Equal(t, len(m.Claims[i].Token), len(back.Claims[i].Token))
		}
		assert.Equal(t, m.Statuses, back.Statuses)
		assert.Equal(t, m.TTL, back.TTL)
		for i := range b {
			_, err := ParseLifeMsg(b[:i])
			require.ErrorIs(t, err, wire.ErrMalformed, "truncated at %d", i)
		}
		_, err = ParseLifeMsg(append(b, 0))
		assert.ErrorIs(t, err, wire.ErrMalformed)
	}
	for _, bad := range [][]byte{nil, {2, 1}, {1, 99, 0, 0, 0, 0, 0, 0, 0, 0}} {
		_, err := ParseLifeMsg(bad)
		assert.ErrorIs(t, err, wire.ErrMalformed)
	}
}

func TestLeaseStatusCodes(t *testing.T) {
	for _, e := range []error{errs.ObjectNotFound, errs.ObjectFreed, errs.StaleRef, errs.Unauthorized} {
		assert.ErrorIs(t, LeaseErrOf(LeaseStatusOf(e)), e)
	}
	assert.Equal(t, LeaseFailed, LeaseStatusOf(errors.New("other")))
	assert.Error(t, LeaseErrOf(200))
	es := LeaseErrs([]byte{LeaseOK, LeaseStatusOf(errs.ObjectFreed), LeaseOK})
	assert.NoError(t, es[0], "granted")
	assert.ErrorIs(t, es[1], errs.ObjectFreed)
	assert.NoError(t, es[2])
}

// FuzzLifeMsg: any bytes a peer sends on the lifecycle protocol decode to
// a message that re-encodes, or fail with wire.ErrMalformed.
func FuzzLifeMsg(f *testing.F) {
	var obj fabric.ObjectID
	f.Add(LifeMsg{Kind: LifePing, Incarnation: 1}.Marshal())
	f.Add(LifeMsg{Kind: LifeLease, Incarnation: 1, Claims: []fabric.Claim{{Object: obj, Incarnation: 3, Token: make([]byte, 16)}}}.Marshal())
	f.Add(LifeMsg{Kind: LifeRelease, Incarnation: 1, Claims: []fabric.Claim{{Object: obj, Incarnation: 3, Token: make([]byte, 16)}},
		Layouts: []Layout{{1, 2, 3}}}.Marshal())
	f.Add(LifeMsg{Kind: LifeLeased, Incarnation: 1, Statuses: []byte{0, 2}, TTL: time.Second}.Marshal())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := ParseLifeMsg(p)
		if err != nil {
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		back, err := ParseLifeMsg(m.Marshal())
		if err != nil || back.Kind != m.Kind || len(back.Claims) != len(m.Claims) || !slices.Equal(back.Layouts, m.Layouts) {
			t.Fatalf("re-encoding changed the message: %v", err)
		}
	})
}
