package tcp

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

type sinkFunc func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error)

func (f sinkFunc) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return f(ctx, c)
}

// pushFixture is an owner with a sink of n bytes (claim: object 2, the
// fixture's token) and a source buffer of n bytes of bf16 weights.
type pushFixture struct {
	*fixture
	sink  []byte
	src   tensor.Buffer
	opens atomic.Int64
}

func newPushFixture(t *testing.T, n int64) *pushFixture { return newPushFixtureWith(t, n, nil) }

// newPushFixtureWith is newPushFixture with the owner's config changed by
// mutate.
func newPushFixtureWith(t testing.TB, n int64, mutate func(*ServerConfig)) *pushFixture {
	pf := &pushFixture{}
	sinkBuf, err := tensor.NewHostMemory(0).Alloc(context.Background(), n)
	require.NoError(t, err)
	t.Cleanup(func() { sinkBuf.Release() })
	pf.sink, _ = tensor.BytesOf(sinkBuf)
	pf.fixture = newFixture(t, 1024, func(c *ServerConfig) {
		c.Sink = sinkFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			pf.opens.Add(1)
			if c.Object != (fabric.ObjectID{2}) {
				return nil, fabric.ErrObjectNotFound
			}
			if !bytes.Equal(c.Token, pf.token) {
				return nil, fabric.ErrUnauthorized
			}
			return nopRelease{sinkBuf}, nil
		})
		if mutate != nil {
			mutate(c)
		}
	})
	pf.src = pf.dst(t, n)
	p, _ := tensor.BytesOf(pf.src)
	tcodec.FillNormal(p, 2, 0.02, 11)
	return pf
}

func (pf *pushFixture) target(off, n int64) fabric.Remote {
	r := pf.remote(n)
	r.Claim.Object = fabric.ObjectID{2}
	r.Offset = off
	r.DType = tensor.BFloat16
	return r
}

func TestPush(t *testing.T) {
	const size = 9<<20 + 123
	pf := newPushFixture(t, size)
	src, _ := tensor.BytesOf(pf.src)
	for _, mode := range []Compression{CompressOff, CompressAlways} {
		tr := pf.transport(t, Config{Compression: mode})
		for _, c := range [][2]int64{{0, 0}, {0, 1}, {5, 4097}, {0, 1<<20 + 7}, {0, size}} {
			t.Run(fmt.Sprintf("%v/%d+%d", mode, c[0], c[1]), func(t *testing.T) {
				clear(pf.sink)
				st, err := tr.Write(context.Background(), pf.src, pf.target(c[0], c[1]))
				require.NoError(t, err)
				assert.Equal(t, c[1], st.Bytes)
				assert.True(t, bytes.Equal(src[:c[1]], pf.sink[c[0]:c[0]+c[1]]), "sink differs")
				assert.False(t, bytes.ContainsFunc(pf.sink[:c[0]], func(r rune) bool { return r != 0 }), "bytes before the range written")
				if c[1] >= 4<<20 {
					assert.Greater(t, st.Streams, 1, "large pushes are striped")
				}
			})
		}
	}
}

func TestPushErrors(t *testing.T) {
	pf := newPushFixture(t, 1<<20)
	tr := pf.transport(t, Config{Compression: CompressAlways})
	ctx := context.Background()

	forged := pf.target(0, 100)
	forged.Claim.Token = []byte("forged-token-000")
	_, err := tr.Write(ctx, pf.src, forged)
	assert.ErrorIs(t, err, fabric.ErrUnauthorized)

	unknown := pf.target(0, 100)
	unknown.Claim.Object = fabric.ObjectID{1} // readable, but not a sink
	_, err = tr.Write(ctx, pf.src, unknown)
	assert.ErrorIs(t, err, fabric.ErrObjectNotFound)

	_, err = tr.Write(ctx, pf.src, pf.target(1, 1<<20))
	assert.ErrorIs(t, err, fabric.ErrBadRequest, "range outside the sink")

	_, err = tr.Write(ctx, pf.src, pf.target(0, 1<<20+1))
	assert.ErrorIs(t, err, fabric.ErrBadRequest, "source shorter than the push")

	// A corrupted block is caught by the owner, who says so.
	tr.corruptNext.Store(true)
	_, err = tr.Write(ctx, pf.src, pf.target(0, 1<<20))
	assert.ErrorIs(t, err, fabric.ErrCorrupt)

	// Refusals leave the transport usable.
	_, err = tr.Write(ctx, pf.src, pf.target(0, 1<<20))
	require.NoError(t, err)
	src, _ := tensor.BytesOf(pf.src)
	assert.True(t, bytes.Equal(src[:1<<20], pf.sink))

	// An owner without a sink refuses pushes.
	_, err = tr.Write(ctx, pf.src, pf.remote(10))
	assert.ErrorIs(t, err, fabric.ErrObjectNotFound)
	noSink := newFixture(t, 1024, nil)
	_, err = noSink.tr.Write(ctx, pf.src, noSink.remote(10))
	assert.ErrorIs(t, err, fabric.ErrObjectNotFound)
}

// TestSmallPushRefusedInStep: a small push sends its blocks before the
// owner's verdict; a refusal skips them, so the connection carries the
// next request, and a corrupt block is still caught. Both codecs.
func TestSmallPushRefusedInStep(t *testing.T) {
	pf := newPushFixture(t, 64<<10)
	src, _ := tensor.BytesOf(pf.src)
	for _, mode := range []Compression{CompressOff, CompressAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			var dials atomic.Int64
			tr := pf.transport(t, Config{Compression: mode, Dial: counting(&dials)})
			ctx := context.Background()
			forged := pf.target(0, 64<<10)
			forged.Claim.Token = []byte("forged-token-000")
			for range 3 {
				_, err := tr.Write(ctx, pf.src, forged)
				assert.ErrorIs(t, err, fabric.ErrUnauthorized)
				_, err = tr.Write(ctx, pf.src, pf.target(1, 64<<10))
				assert.ErrorIs(t, err, fabric.ErrBadRequest)
				clear(pf.sink)
				_, err = tr.Write(ctx, pf.src, pf.target(0, 64<<10))
				require.NoError(t, err)
				assert.True(t, bytes.Equal(src[:64<<10], pf.sink))
			}
			assert.Equal(t, int64(1), dials.Load(), "refusals kept the connection in step")

			tr.corruptNext.Store(true)
			_, err := tr.Write(ctx, pf.src, pf.target(0, 4096))
			assert.ErrorIs(t, err, fabric.ErrCorrupt)
			_, err = tr.Write(ctx, pf.src, pf.target(0, 4096))
			require.NoError(t, err)
		})
	}
}
