package tcp

import (
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// sendAll runs sendBlocks over a pipe whose far end discards, and returns
// the link (for its counters) and the wire bytes.
func sendAll(t *testing.T, data []byte, hint tcodec.Hint) (*link, int64) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go io.Copy(io.Discard, b)
	l := newLink(a, 10*time.Second)
	wire, err := l.sendBlocks(nil, data, 256<<10, true, hint, false, false)
	require.NoError(t, err)
	b.Close()
	return l, wire
}

// An incompressible transfer asked to compress goes raw after a cheap
// sample, without running the codec over every block (issue 19.8: a fresh
// tcp pair's second 1 MiB Get took 11-18 ms against 0.5 ms warm).
func TestSampleSkipsIncompressible(t *testing.T) {
	random := make([]byte, 1<<20)
	rand.Read(random)
	for _, hint := range []tcodec.Hint{tcodec.HintFor(tensor.Uint8), tcodec.HintFor(tensor.BFloat16), tcodec.HintFor(tensor.Float32)} {
		l, wire := sendAll(t, random, hint)
		assert.Equal(t, 0, l.encoded, "no block went through the codec (%+v)", hint)
		assert.Equal(t, 1, l.sampleSkips)
		assert.Equal(t, int64(len(random)+4*headerSize), wire, "raw blocks")
	}

	weights := make([]byte, 1<<20)
	tcodec.FillNormal(weights, 2, 0.02, 3)
	l, wire := sendAll(t, weights, tcodec.HintFor(tensor.BFloat16))
	assert.Equal(t, 4, l.encoded, "compressible data is compressed, every block")
	assert.Zero(t, l.sampleSkips)
	assert.Less(t, wire, int64(len(weights)))

	// Mostly random with a compressible tail: one shrinking slice is enough.
	mixed := append([]byte(nil), random...)
	clear(mixed[len(mixed)-64<<10:])
	l, _ = sendAll(t, mixed, tcodec.HintFor(tensor.Uint8))
	assert.Zero(t, l.sampleSkips)
	// Too small to sample: compressed as asked.
	l, _ = sendAll(t, random[:sampleMin-1], tcodec.HintFor(tensor.Uint8))
	assert.Zero(t, l.sampleSkips)
	assert.Positive(t, l.encoded)
}
