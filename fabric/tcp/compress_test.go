package tcp

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

// transport returns a reader-side transport with cfg (Identity filled in).
func (f *fixture) transport(t testing.TB, cfg Config) *Transport {
	cfg.Identity, _ = testhelp.Key(t)
	if cfg.StripeMin == 0 {
		cfg.StripeMin = 1 << 20
	}
	tr, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr
}

// fillAs overwrites the fixture's object with data shaped like dt.
func (f *fixture) fillAs(dt tensor.DType) {
	switch dt {
	case tensor.BFloat16, tensor.Float16:
		tcodec.FillNormal(f.data, 2, 0.02, 3)
	case tensor.Float32:
		tcodec.FillNormal(f.data, 4, 0.02, 3)
	default:
		for i := range f.data {
			f.data[i] = byte(i / 4096) // compressible integers
		}
	}
}

func TestCompressedReadRoundTrip(t *testing.T) {
	f := newFixture(t, 9<<20+123, nil)
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32, tensor.Int32, tensor.Invalid} {
		f.fillAs(dt)
		for _, mode := range []Compression{CompressAlways, CompressOff} {
			reg := prometheus.NewRegistry()
			tr := f.transport(t, Config{Compression: mode, Registerer: reg})
			for _, n := range []int64{0, 1, 4097, DefaultChunkSize + 3, 1<<20 + 1, 9<<20 + 123} {
				t.Run(fmt.Sprintf("%v/%v/%d", dt, mode, n), func(t *testing.T) {
					r := f.remote(n)
					r.DType = dt
					dst := f.dst(t, n)
					st, err := tr.Read(context.Background(), r, dst)
					require.NoError(t, err)
					assert.Equal(t, n, st.Bytes)
					got, _ := tensor.BytesOf(dst)
					assert.True(t, bytes.Equal(f.data[:n], got), "bytes differ")
				})
			}
			raw, wire := testutil.ToFloat64(tr.m.raw), testutil.ToFloat64(tr.m.wire)
			if mode == CompressOff {
				assert.Zero(t, raw, "nothing compressed when off")
				continue
			}
			assert.Greater(t, raw, 0.0)
			// Every one of these shapes compresses (integers through s2).
			assert.Less(t, wire, 0.9*raw, "%v: wire %v of raw %v", dt, wire, raw)
		}
	}
}

func TestCorruptCompressedBlock(t *testing.T) {
	f := newFixture(t, 4<<20, nil)
	f.fillAs(tensor.BFloat16)
	tr := f.transport(t, Config{Compression: CompressAlways})
	r := f.remote(4 << 20)
	r.DType = tensor.BFloat16
	f.srv.corruptNext.Store(true)
	_, err := tr.Read(context.Background(), r, f.dst(t, 4<<20))
	assert.ErrorIs(t, err, fabric.ErrCorrupt)
	// The next read is clean.
	dst := f.dst(t, 4<<20)
	_, err = tr.Read(context.Background(), r, dst)
	require.NoError(t, err)
	got, _ := tensor.BytesOf(dst)
	assert.True(t, bytes.Equal(f.data[:4<<20], got))
}

func TestDecide(t *testing.T) {
	const codec = 1e9 // bytes/s
	for _, c := range []struct {
		name   string
		mode   Compression
		n      int64
		est    linkEstimate
		want   bool
		reason string
	}{
		{"empty", CompressAlways, 0, linkEstimate{}, false, "empty"},
		{"off", CompressOff, 64 << 20, linkEstimate{bps: 1e6}, false, "off"},
		{"always", CompressAlways, 10, linkEstimate{bps: 1e12}, true, "always"},
		{"small", CompressAuto, 4096, linkEstimate{bps: 1e6}, false, "small"},
		{"unmeasured", CompressAuto, 64 << 20, linkEstimate{}, false, "link-unmeasured"},
		{"fast link", CompressAuto, 64 << 20, linkEstimate{bps: 2.5e9}, false, "link-faster"},
		{"equal link", CompressAuto, 64 << 20, linkEstimate{bps: codec}, false, "link-faster"},
		{"slow link", CompressAuto, 64 << 20, linkEstimate{bps: 125e6}, true, "link-slower"},
		{"slow link, compressible", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, ratio: 0.7}, true, "link-slower"},
		{"slow link, incompressible", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, ratio: 0.99}, false, "incompressible"},
		{"incompressible, probe", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, ratio: 0.99, skipped: probeEvery - 1}, true, "probe-compressed"},
		{"compressed long enough, probe raw", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, compressed: probeEvery - 1}, false, "probe-raw"},
		{"compression pays", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, compBps: 180e6, ratio: 0.67}, true, "link-slower"},
		{"compression does not pay (busy CPU)", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, compBps: 80e6, ratio: 0.67}, false, "compressed-slower"},
		{"does not pay, retry", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, compBps: 80e6, ratio: 0.67, skipped: retryCompressed - 1}, true, "probe-compressed"},
		{"incompressible, not yet", CompressAuto, 64 << 20, linkEstimate{bps: 125e6, ratio: 0.99, skipped: retryCompressed - 1}, false, "incompressible"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, reason := decide(c.mode, c.n, c.est, codec)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.reason, reason)
		})
	}
}

func TestObserve(t *testing.T) {
	var l links
	k := connKey{"p", "a"}
	// Small transfers say nothing about throughput.
	l.observe(k, false, "link-unmeasured", 4096, 4096, 1e6)
	assert.Zero(t, l.get(k).bps)
	// A raw transfer of 100 MB in 1 s: 100 MB/s.
	l.observe(k, false, "link-unmeasured", 100e6, 100e6, 1e9)
	assert.InDelta(t, 100e6, l.get(k).bps, 1)
	// A compressed transfer measures compression, not the link.
	l.observe(k, true, "link-slower", 100e6, 70e6, time.Second*10/14)
	e := l.get(k)
	assert.InDelta(t, 100e6, e.bps, 1)
	assert.InDelta(t, 0.7, e.ratio, 1e-9)
	assert.InDelta(t, 140e6, e.compBps, 1)
	assert.Equal(t, 1, e.compressed)
	// A raw probe updates the link (EWMA) and resets the count.
	l.observe(k, false, "probe-raw", 100e6, 100e6, time.Second*10/11)
	e = l.get(k)
	assert.InDelta(t, 0.7*100e6+0.3*110e6, e.bps, 1)
	assert.Zero(t, e.compressed)
	// Raw transfers that skipped compression count towards the next probe.
	l.observe(k, false, "compressed-slower", 100e6, 100e6, 1e9)
	assert.Equal(t, 1, l.get(k).skipped)
	l.observe(k, true, "probe-compressed", 100e6, 70e6, 1e9)
	assert.Zero(t, l.get(k).skipped)
}

// The auto decision as the transport takes it, with the link estimate
// injected: no timing in the test.
func TestAutoCompression(t *testing.T) {
	f := newFixture(t, 4<<20, nil)
	f.fillAs(tensor.BFloat16)
	reg := prometheus.NewRegistry()
	tr := f.transport(t, Config{CodecBps: 1e9, Registerer: reg})
	r := f.remote(4 << 20)
	r.DType = tensor.BFloat16
	k := connKey{r.Peer, r.Addrs[fabric.TCP]}
	count := func(compress, reason string) float64 {
		return testutil.ToFloat64(tr.m.decisions.WithLabelValues(compress, reason))
	}
	read := func() {
		t.Helper()
		dst := f.dst(t, 4<<20)
		_, err := tr.Read(context.Background(), r, dst)
		require.NoError(t, err)
		got, _ := tensor.BytesOf(dst)
		require.True(t, bytes.Equal(f.data[:4<<20], got))
	}
	tr.links.set(k, 100e6, 0) // a 100 MB/s link: slower than the codec
	read()
	assert.Equal(t, 1.0, count("true", "link-slower"))
	assert.Greater(t, testutil.ToFloat64(tr.m.raw), testutil.ToFloat64(tr.m.wire))

	tr.links.set(k, 10e9, 0) // a 10 GB/s link: faster than the codec
	read()
	assert.Equal(t, 1.0, count("false", "link-faster"))

	tr.links.set(k, 100e6, 0.99) // slow, but the data does not shrink
	read()
	assert.Equal(t, 1.0, count("false", "incompressible"))
}

// TestCodecThroughputRefreshes: the codec's rate is measured again once
// its measurement is older than codecRefresh (a measurement taken under
// load must not hold for the process's life), and not before.
func TestCodecThroughputRefreshes(t *testing.T) {
	first := codecThroughput(1)
	require.Positive(t, first)
	at := codecAt.Load()
	codecThroughput(1)
	assert.Equal(t, at, codecAt.Load(), "a fresh measurement stands")
	old := time.Now().Add(-2 * codecRefresh).UnixNano()
	codecAt.Store(old)
	assert.Positive(t, codecThroughput(1))
	assert.Greater(t, codecAt.Load(), old, "a stale one is taken again")

	// While one caller measures again, the others decide by the last
	// figure rather than wait for it.
	codecAt.Store(old)
	last := math.Float64frombits(codecCore.Load())
	codecMu.Lock() // a measurement in progress
	got := codecThroughput(1)
	codecMu.Unlock()
	assert.Equal(t, last, got, "the last figure")
	assert.Equal(t, old, codecAt.Load(), "not measured by a caller that found a measurement under way")
}
