package tcp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestSealedReadsAndPushes: on encrypted connections the AEAD stands in for
// the block checksums (flagSealed), striped or not, pulled or pushed, and
// the bytes arrive whole; SealedChecksums keeps them.
func TestSealedReadsAndPushes(t *testing.T) {
	const size = 9<<20 + 123
	f := newFixture(t, size, func(c *ServerConfig) { c.EncryptData = true })
	pf := newPushFixtureWith(t, size, func(c *ServerConfig) { c.EncryptData = true })
	src, _ := tensor.BytesOf(pf.src)
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("SealedChecksums=%v", keep), func(t *testing.T) {
			cfg := Config{Compression: CompressOff, SealedChecksums: keep, Security: fabric.Security{EncryptData: true}}
			tr := f.transport(t, cfg)
			ptr := pf.transport(t, cfg)
			for _, n := range []int64{1, 4096, DefaultChunkSize + 1, size} {
				dst := f.dst(t, n)
				st, err := tr.Read(context.Background(), f.remote(n), dst)
				require.NoError(t, err)
				got, _ := tensor.BytesOf(dst)
				require.True(t, bytes.Equal(f.data[:n], got), "read of %d bytes differs", n)
				if n == size {
					assert.Greater(t, st.Streams, 1)
				}
				clear(pf.sink)
				_, err = ptr.Write(context.Background(), pf.src, pf.target(0, n))
				require.NoError(t, err)
				require.True(t, bytes.Equal(src[:n], pf.sink[:n]), "push of %d bytes differs", n)
			}
			if keep {
				assert.Zero(t, tr.sealedN.Load()+ptr.sealedN.Load(), "checksums kept")
			} else {
				assert.GreaterOrEqual(t, tr.sealedN.Load(), int64(4), "reads sealed")
				assert.GreaterOrEqual(t, ptr.sealedN.Load(), int64(4), "pushes sealed")
			}
		})
	}
}

// TestSealedOldOwner: an owner from before flagSealed refuses it as a bad
// request with unknown flags and hangs up; the reader asks again with
// checksums on a new connection and remembers, so later transfers to that
// owner pay no second dial.
func TestSealedOldOwner(t *testing.T) {
	const size = 2 << 20
	f := newFixture(t, size, func(c *ServerConfig) { c.EncryptData = true })
	f.srv.refuseSealed.Store(true)
	var dials atomic.Int64
	tr := f.transport(t, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}, Dial: counting(&dials), StripeMin: size})
	for i := range 3 {
		dst := f.dst(t, size)
		_, err := tr.Read(context.Background(), f.remote(size), dst)
		require.NoError(t, err, "read %d", i)
		got, _ := tensor.BytesOf(dst)
		require.True(t, bytes.Equal(f.data, got))
	}
	assert.Equal(t, int64(2), dials.Load(), "one refused connection, then one for good")
	assert.Zero(t, tr.sealedN.Load())

	for _, n := range []int64{4096, 1 << 20} { // eager and with the go-ahead
		pf := newPushFixtureWith(t, n, func(c *ServerConfig) { c.EncryptData = true })
		pf.srv.refuseSealed.Store(true)
		var pdials atomic.Int64
		ptr := pf.transport(t, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}, Dial: counting(&pdials)})
		src, _ := tensor.BytesOf(pf.src)
		for i := range 2 {
			clear(pf.sink)
			_, err := ptr.Write(context.Background(), pf.src, pf.target(0, n))
			require.NoError(t, err, "push %d of %d bytes", i, n)
			require.True(t, bytes.Equal(src[:n], pf.sink[:n]))
		}
		assert.Equal(t, int64(2), pdials.Load(), "push of %d bytes", n)
	}
}

// TestSealedFlagOnPlainConnection: a reader that claims flagSealed on a
// connection that is not encrypted is refused as a bad request; the owner
// never sends blocks without checksums in clear.
func TestSealedFlagOnPlainConnection(t *testing.T) {
	f := newFixture(t, 4096, nil)
	readerKey, _ := testhelp.Key(t)
	c, err := net.Dial("tcp", f.srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = peerauth.ClientWith(c, readerKey, f.ownerID, peerauth.Options{})
	require.NoError(t, err)
	req := request{op: opRead, claim: f.remote(4096).Claim, length: 4096, flags: flagSealed}
	_, err = c.Write(req.appendTo(nil))
	require.NoError(t, err)
	var code [1]byte
	_, err = c.Read(code[:])
	require.NoError(t, err)
	assert.Equal(t, peerauth.StatusBadRequest, code[0])
}

// BenchmarkReadSealed: encrypted 64 MiB reads with the AEAD as the check
// (sealed) and with XXH3 checksums kept, interleaved; cpu-sealed/summed is
// the CPU both ends spent per read, sealed over summed (below 1: the pass
// saved), speed-sealed/summed the throughput ratio.
func BenchmarkReadSealed(b *testing.B) {
	const n = 64 << 20
	f := newFixture(b, n, func(c *ServerConfig) { c.EncryptData = true })
	sealed := f.transport(b, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}, StripeMin: 8 << 20})
	summed := f.transport(b, Config{Compression: CompressOff, Security: fabric.Security{EncryptData: true}, StripeMin: 8 << 20, SealedChecksums: true})
	dst := f.dst(b, n)
	ctx := context.Background()
	var cpu, wall [2]time.Duration
	for _, tr := range []*Transport{sealed, summed} { // connect, fault dst in
		_, err := tr.Read(ctx, f.remote(n), dst)
		require.NoError(b, err)
	}
	b.SetBytes(2 * n)
	round := 0
	for b.Loop() {
		for k := range 2 {
			i := (k + round) % 2
			tr := []*Transport{sealed, summed}[i]
			c0, t0 := testhelp.CPUTime(), time.Now()
			if _, err := tr.Read(ctx, f.remote(n), dst); err != nil {
				b.Fatal(err)
			}
			wall[i] += time.Since(t0)
			cpu[i] += testhelp.CPUTime() - c0
		}
		round++
	}
	b.ReportMetric(cpu[0].Seconds()/cpu[1].Seconds(), "cpu-sealed/summed")
	b.ReportMetric(wall[1].Seconds()/wall[0].Seconds(), "speed-sealed/summed")
}
