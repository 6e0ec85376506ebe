package fabric

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The wire bits are a format: a ref written by one version is read by
// another. They may gain rows, never change.
func TestRegistryWireBitsAreStable(t *testing.T) {
	want := map[string]uint8{Local: 0, P2P: 1, SHM: 2, RDMA: 3, TCP: 4}
	bits, ranks := map[uint8]string{}, map[int]string{}
	for _, tr := range Registered() {
		if b, ok := want[tr.Name]; ok {
			assert.Equal(t, b, tr.WireBit, tr.Name)
		}
		assert.Less(t, tr.WireBit, uint8(8), "a ref's mask is one byte")
		assert.NotContains(t, bits, tr.WireBit, "wire bit %d used twice", tr.WireBit)
		assert.NotContains(t, ranks, tr.Rank, "rank %d used twice", tr.Rank)
		bits[tr.WireBit], ranks[tr.Rank] = tr.Name, tr.Name
	}
	assert.Equal(t, []string{Local, P2P, SHM, RDMA, TCP}, Names(), "best first")
}

func TestWireMask(t *testing.T) {
	cases := []struct {
		names []string
		mask  byte
		back  []string
	}{
		{nil, 0, nil},
		{[]string{TCP, Local}, 0b10001, []string{Local, TCP}},
		{[]string{Local, P2P, SHM, RDMA, TCP}, 0b11111, []string{Local, P2P, SHM, RDMA, TCP}},
		{[]string{"warp-drive", RDMA}, 0b01000, []string{RDMA}},
	}
	for _, c := range cases {
		assert.Equal(t, c.mask, WireMask(c.names), "%v", c.names)
		assert.Equal(t, c.back, FromWireMask(c.mask))
	}
	// A newer owner's transport (an unknown bit) is ignored, not an error.
	assert.Equal(t, []string{TCP}, FromWireMask(0b1001_0000))
}

func TestOrdered(t *testing.T) {
	assert.Equal(t, []string{P2P, SHM, TCP, "other"}, Ordered([]string{"other", TCP, P2P, SHM}))
	assert.True(t, Known(SHM))
	assert.False(t, Known("SHM"))
}
