package tcp

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// summedPin is a sealed object's pin: its buffer and checksum cache.
type summedPin struct {
	tensor.Buffer
	sums *tensor.ChunkSums
}

func (p summedPin) Bytes() []byte                { return p.Buffer.(tensor.HostVisible).Bytes() }
func (p summedPin) ChunkSums() *tensor.ChunkSums { return p.sums }
func (p summedPin) Release() error               { return p.Buffer.Release() }
func (p summedPin) Device() tensor.DeviceID      { return p.Buffer.Device() }
func (p summedPin) Len() int64                   { return p.Buffer.Len() }
func blocks(n int64) int64                       { return (n + DefaultChunkSize - 1) / DefaultChunkSize }
func (s SumStats) total() int64                  { return s.Cached + s.Stored + s.Computed }
func sealedSource(src fabric.Source, sums *atomic.Pointer[tensor.ChunkSums]) fabric.Source {
	return fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
		b, err := src.Open(ctx, c)
		if err != nil || sums.Load() == nil {
			return b, err
		}
		return summedPin{b, sums.Load()}, nil
	})
}

// The cache's grid and checksum are the wire's.
func TestChunkSumsMatchTheWire(t *testing.T) {
	require.Equal(t, DefaultChunkSize, tensor.SumChunk)
	p := make([]byte, DefaultChunkSize)
	for i := range p {
		p[i] = byte(i * 31)
	}
	assert.Equal(t, tcodec.Checksum(p), tensor.Sum(p))
}

// TestCachedChecksums: a sealed object's first read computes its blocks'
// checksums and stores them; every later read, whole, striped or in
// stripes of their own, sends them from the cache and reads the object's
// memory for none; a request off the grid computes. The counters say
// which, and so does the Prometheus counter.
func TestCachedChecksums(t *testing.T) {
	const size = 9<<20 + 123
	var sums atomic.Pointer[tensor.ChunkSums]
	reg := prometheus.NewRegistry()
	f := newFixture(t, size, func(c *ServerConfig) {
		c.Source = sealedSource(c.Source, &sums)
		c.Registerer = reg
	})
	sums.Store(tensor.NewChunkSums(0, size))
	tr := f.transport(t, Config{Compression: CompressOff, StripeMin: 1 << 20})
	read := func(off, n int64) {
		t.Helper()
		dst := f.dst(t, n)
		r := f.remote(n)
		r.Offset = off
		_, err := tr.Read(context.Background(), r, dst)
		require.NoError(t, err)
		got, _ := tensor.BytesOf(dst)
		require.True(t, bytes.Equal(f.data[off:off+n], got), "read [%d,+%d) differs", off, n)
	}

	read(0, size)
	st := f.srv.SendSums()
	assert.Equal(t, SumStats{Stored: blocks(size)}, st, "the first read computes and stores every block's")
	known, all := sums.Load().Known()
	assert.Equal(t, all, known)
	for off := int64(0); off < size; off += DefaultChunkSize {
		b := f.data[off:min(off+DefaultChunkSize, size)]
		s, ok := sums.Load().Get(off, len(b))
		require.True(t, ok)
		require.Equal(t, tcodec.Checksum(b), s, "block at %d", off)
	}

	read(0, size)
	read(0, 4096)                 // the first block, short: off the grid
	read(DefaultChunkSize, 1<<20) // four whole blocks
	read(100, 4096)               // off the grid
	got := f.srv.SendSums()
	assert.Equal(t, SumStats{Cached: blocks(size) + 4, Stored: blocks(size), Computed: 2}, got)
	assert.Equal(t, float64(blocks(size)+4), testutil.ToFloat64(f.srv.sums.vec[sumCached]))
	assert.Equal(t, float64(2), testutil.ToFloat64(f.srv.sums.vec[sumComputed]))
}

// TestMutatedSealedObjectDetected: bytes of a sealed object changed after
// its checksums were cached reach the reader as fabric.ErrCorrupt, never
// as data; the same change to an object that is not sealed is read as it
// is now (its checksums are computed at send).
func TestMutatedSealedObjectDetected(t *testing.T) {
	const size = 2 << 20
	var sums atomic.Pointer[tensor.ChunkSums]
	f := newFixture(t, size, func(c *ServerConfig) { c.Source = sealedSource(c.Source, &sums) })
	tr := f.transport(t, Config{Compression: CompressOff})
	read := func() ([]byte, error) {
		dst := f.dst(t, size)
		_, err := tr.Read(context.Background(), f.remote(size), dst)
		got, _ := tensor.BytesOf(dst)
		return got, err
	}

	sums.Store(tensor.NewChunkSums(0, size))
	sums.Load().Fill(f.data) // as the copy that made the object would
	_, err := read()
	require.NoError(t, err)
	assert.Equal(t, SumStats{Cached: blocks(size)}, f.srv.SendSums())

	f.data[size/2] ^= 0xff // a write the seal promised would not come
	_, err = read()
	require.ErrorIs(t, err, fabric.ErrCorrupt)

	sums.Store(nil) // not sealed: computed at send
	// At least every block of this read; the owner may still be sending
	// blocks of the corrupt read on its other streams when the reader
	// gave up, and those are computed now too.
	before := f.srv.SendSums().Computed
	got, err := read()
	require.NoError(t, err)
	assert.True(t, bytes.Equal(f.data, got))
	assert.GreaterOrEqual(t, f.srv.SendSums().Computed-before, blocks(size))
}

// TestCachedChecksumsNotOnSealedLinks: on an encrypted link whose AEAD is
// the check (flagSealed) no block carries a checksum, so the cache is
// neither read nor filled.
func TestCachedChecksumsNotOnSealedLinks(t *testing.T) {
	const size = 1 << 20
	var sums atomic.Pointer[tensor.ChunkSums]
	f := newFixture(t, size, func(c *ServerConfig) {
		c.Source = sealedSource(c.Source, &sums)
		c.EncryptData = true
	})
	sums.Store(tensor.NewChunkSums(0, size))
	tr := f.transport(t, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}})
	_, err := tr.Read(context.Background(), f.remote(size), f.dst(t, size))
	require.NoError(t, err)
	assert.Zero(t, f.srv.SendSums().total())
	known, _ := sums.Load().Known()
	assert.Zero(t, known)
}

// TestPushSendsCachedChecksums: a push of a sealed object (its buffer
// tensor.Summed) sends the cached checksums, striped or not; the owner
// verifies them as it lands the bytes.
func TestPushSendsCachedChecksums(t *testing.T) {
	const size = 9<<20 + 123
	pf := newPushFixtureWith(t, size, nil)
	src, _ := tensor.BytesOf(pf.src)
	sums := tensor.NewChunkSums(0, size)
	sums.Fill(src)
	tr := pf.transport(t, Config{Compression: CompressOff, StripeMin: 1 << 20})
	_, err := tr.Write(context.Background(), summedPin{pf.src, sums}, pf.target(0, size))
	require.NoError(t, err)
	require.True(t, bytes.Equal(src, pf.sink[:size]))
	assert.Equal(t, SumStats{Cached: blocks(size)}, tr.SendSums())

	// A window of the object from byte w sees the cache shifted.
	const w = 2 * DefaultChunkSize
	clear(pf.sink)
	win := summedPin{windowOf(pf.src, w), sums.Shifted(-w)}
	_, err = tr.Write(context.Background(), win, pf.target(0, size-w))
	require.NoError(t, err)
	require.True(t, bytes.Equal(src[w:], pf.sink[:size-w]))
	assert.Equal(t, SumStats{Cached: 2*blocks(size) - 2}, tr.SendSums())

	// Changed after sealing: the owner refuses the push as corrupt.
	src[100] ^= 1
	_, err = tr.Write(context.Background(), summedPin{pf.src, sums}, pf.target(0, size))
	require.ErrorIs(t, err, fabric.ErrCorrupt)
}

// windowOf is buf from byte off.
type window struct {
	tensor.Buffer
	off int64
}

func windowOf(b tensor.Buffer, off int64) window { return window{b, off} }
func (w window) Len() int64                      { return w.Buffer.Len() - w.off }
func (w window) Bytes() []byte                   { b, _ := tensor.BytesOf(w.Buffer); return b[w.off:] }
