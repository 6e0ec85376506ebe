package rdt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Each benchmark interleaves the measured path with its baseline in the same
// loop and reports both rates and their ratio, so drift on a shared machine
// cancels out. Run: go test -run '^$' -bench . ./rdt/

func benchPair(b *testing.B) (owner, near, far *Actor, stop func()) {
	ctx := context.Background()
	cl, _ := topology.Preset("dgx-h100", 2)
	ra, err := New(ctx, Config{Cluster: cl, Host: "h0", IgnoreEnv: true, DeviceMemory: 4 << 30})
	if err != nil {
		b.Fatal(err)
	}
	// far reads over tcp: with rdma on it would take the (software) rdma
	// path, and a tcp benchmark must not measure another transport.
	rb, err := New(ctx, Config{Cluster: cl, Host: "h1", IgnoreEnv: true, DeviceMemory: 4 << 30, DisableRDMA: true})
	if err != nil {
		b.Fatal(err)
	}
	owner, _ = ra.Spawn("owner")
	near, _ = ra.Spawn("near")
	far, _ = rb.Spawn("far")
	return owner, near, far, func() { ra.Shutdown(ctx); rb.Shutdown(ctx) }
}

// getOver times one Get by a of ref onto dst and fails the benchmark if it
// took another transport than want.
func getOver(b *testing.B, a *Actor, ref Ref, dst tensor.DeviceID, want string) time.Duration {
	start := time.Now()
	v, x, err := a.Fetch(context.Background(), ref, dst)
	d := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	v.Release()
	if x.Stats.Transport != want {
		b.Fatalf("the Get took %q, the benchmark measures %q", x.Stats.Transport, want)
	}
	return d
}

func put(b *testing.B, a *Actor, size int64) (Ref, []byte) {
	mem, _ := a.rt.Memory(tensor.GPUDevice(0))
	x, err := tensor.Alloc(context.Background(), mem, tensor.Uint8, size)
	if err != nil {
		b.Fatal(err)
	}
	p, _ := x.SpanBytes()
	for i := range p {
		p[i] = byte(i)
	}
	ref, err := a.Put(context.Background(), x)
	if err != nil {
		b.Fatal(err)
	}
	return ref, p
}

type ratio struct{ path, base time.Duration }

func (r ratio) report(b *testing.B, size int64, baseName string) {
	n := float64(b.N) * float64(size) / 1e9
	b.ReportMetric(n/r.path.Seconds(), "GB/s")
	b.ReportMetric(n/r.base.Seconds(), baseName+"-GB/s")
	b.ReportMetric(r.base.Seconds()/r.path.Seconds(), "ratio-vs-"+baseName)
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// Same-device Get is a zero-copy view: its time must not grow with size.
func BenchmarkGetSameDevice(b *testing.B) {
	owner, _, _, stop := benchPair(b)
	defer stop()
	for _, n := range []int64{1 << 10, 1 << 30} {
		ref, _ := put(b, owner, n)
		b.Run(size(n), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				v, err := owner.Get(context.Background(), ref, tensor.GPUDevice(0))
				if err != nil {
					b.Fatal(err)
				}
				v.Release()
			}
		})
	}
}

// In-process copy between NVLink-joined simulated GPUs against memcpy.
func BenchmarkGetP2P(b *testing.B) {
	owner, near, _, stop := benchPair(b)
	defer stop()
	const n = 64 << 20
	ref, src := put(b, owner, n)
	dst := make([]byte, n)
	copy(dst, src) // fault the baseline's pages in, as the arena's are
	b.Run(size(n), func(b *testing.B) {
		b.SetBytes(n)
		b.ReportAllocs()
		var r ratio
		for i := 0; i < b.N; i++ {
			start := time.Now()
			v, err := near.Get(context.Background(), ref, tensor.GPUDevice(1))
			if err != nil {
				b.Fatal(err)
			}
			r.path += time.Since(start)
			v.Release()
			r.base += bench.Memcpy(dst, src)
		}
		r.report(b, n, "memcpy")
	})
}

// tcp Get between two runtimes against a raw loopback socket, a libp2p
// stream and the object-store way (serialize, socket, deserialize) moving
// the same bytes.
func BenchmarkGetTCP(b *testing.B) {
	owner, _, far, stop := benchPair(b)
	defer stop()
	for _, n := range []int64{64 << 20, 256 << 20} {
		ref, src := put(b, owner, n)
		raw, err := bench.NewTCPPair(src)
		if err != nil {
			b.Fatal(err)
		}
		p2p, err := bench.NewLibp2pPair(context.Background(), src)
		if err != nil {
			b.Fatal(err)
		}
		ser, err := bench.NewSerializePair(src)
		if err != nil {
			b.Fatal(err)
		}
		dst := make([]byte, n)
		copy(dst, src)
		b.Run(size(n), func(b *testing.B) {
			b.SetBytes(n)
			b.ReportAllocs()
			var vsRaw, vsP2P, vsSer ratio
			for i := 0; i < b.N; i++ {
				d := getOver(b, far, ref, tensor.GPUDevice(1), fabric.TCP)
				vsRaw.path += d
				vsP2P.path += d
				vsSer.path += d
				t, err := raw.Read(dst)
				if err != nil {
					b.Fatal(err)
				}
				vsRaw.base += t
				if t, err = p2p.Read(dst); err != nil {
					b.Fatal(err)
				}
				vsP2P.base += t
				if t, err = ser.Read(dst); err != nil {
					b.Fatal(err)
				}
				vsSer.base += t
			}
			vsRaw.report(b, n, "rawtcp")
			b.ReportMetric(vsP2P.base.Seconds()/vsP2P.path.Seconds(), "ratio-vs-libp2p")
			b.ReportMetric(vsSer.base.Seconds()/vsSer.path.Seconds(), "ratio-vs-serialize")
		})
		raw.Close()
		p2p.Close()
		ser.Close()
	}
}

// BenchmarkGetTCPEncrypted interleaves Gets of one object over tcp by a
// reader that encrypts its data connections (EncryptData) and one that does
// not; ratio-vs-plain is the encrypted rate over the plain one.
func BenchmarkGetTCPEncrypted(b *testing.B) {
	ctx := context.Background()
	cl, _ := topology.Preset("dgx-h100", 3)
	mk := func(host string, enc bool) *Runtime {
		// rdma off on both readers: encryption turns it off, and the plain
		// reader must move the bytes the same way for the ratio to mean
		// what encryption costs.
		r, err := New(ctx, Config{Cluster: cl, Host: host, IgnoreEnv: true, DeviceMemory: 1 << 30, EncryptData: enc, DisableRDMA: true})
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	ra, rPlain, rEnc := mk("h0", false), mk("h1", false), mk("h2", true)
	defer func() { ra.Shutdown(ctx); rPlain.Shutdown(ctx); rEnc.Shutdown(ctx) }()
	owner, _ := ra.Spawn("owner")
	plain, _ := rPlain.Spawn("plain")
	enc, _ := rEnc.Spawn("enc")
	for _, n := range []int64{64 << 20} {
		ref, _ := put(b, owner, n)
		b.Run(size(n), func(b *testing.B) {
			b.SetBytes(n)
			var r ratio
			for i := 0; i < b.N; i++ {
				r.path += getOver(b, enc, ref, tensor.GPUDevice(0), fabric.TCP)
				r.base += getOver(b, plain, ref, tensor.GPUDevice(0), fabric.TCP)
			}
			r.report(b, n, "plain")
		})
	}
}
