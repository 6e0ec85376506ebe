package rdt

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Each benchmark interleaves the measured path with its baselines in the
// same loop and reports every rate and the ratios, so drift on a shared
// machine cancels out. Run: go test -run '^$' -bench . ./rdt/ and compare
// runs with benchstat (docs/benchmarks.md).

// benchPath is one way a reader in benchEnv reaches the owner's GPU 0.
type benchPath struct {
	name      string
	reader    *Actor
	dst       tensor.DeviceID
	transport string // what every timed transfer must report
	network   bool   // baselines are sockets, not memcpy
}

// benchEnv is a simulated two-host cluster with a reader for every path:
// the owner's own runtime (local, p2p), a second runtime on its host
// (p2p-ipc, shm), one on the other host with rdma (rdma) and one without
// (tcp: with rdma on it would take rdma, and a tcp benchmark must not
// measure another transport).
type benchEnv struct {
	owner *Actor
	paths []benchPath
	stop  func()
}

func newBenchEnv(b *testing.B) benchEnv {
	ctx := context.Background()
	cl, _ := topology.Preset("dgx-h100", 2)
	var rts []*Runtime
	mk := func(host string, noRDMA bool) *Runtime {
		r, err := New(ctx, Config{Cluster: cl, Host: host, IgnoreEnv: true, RuntimeDir: b.TempDir(), DeviceMemory: 1 << 30, Transports: stack.Config{DisableRDMA: noRDMA}})
		if err != nil {
			b.Fatal(err)
		}
		rts = append(rts, r)
		return r
	}
	spawn := func(r *Runtime, name string) *Actor {
		a, err := r.Spawn(name)
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	ra, rc, rr, rt := mk("h0", false), mk("h0", false), mk("h1", false), mk("h1", true)
	e := benchEnv{owner: spawn(ra, "owner")}
	e.paths = []benchPath{
		{"local", spawn(ra, "local"), tensor.GPUDevice(0), fabric.Local, false},
		{"p2p", spawn(ra, "p2p"), tensor.GPUDevice(1), fabric.P2P, false},
		{"p2p-ipc", spawn(rc, "p2p-ipc"), tensor.GPUDevice(1), fabric.P2P, false},
		{"shm", spawn(rc, "shm"), tensor.HostDevice, fabric.SHM, false},
		{"rdma", spawn(rr, "rdma"), tensor.GPUDevice(1), fabric.RDMA, true},
		{"tcp", spawn(rt, "tcp"), tensor.GPUDevice(1), fabric.TCP, true},
	}
	e.stop = func() {
		for i := len(rts) - 1; i >= 0; i-- {
			rts[i].Shutdown(ctx)
		}
	}
	return e
}

// baselines are the same-run references for one size: memcpy (on-host
// paths) or one raw TCP socket (network paths), and the object-store way
// (serialize, across a socket for network paths).
type baselines struct {
	src, dst []byte
	raw      *bench.TCPPair
	ser      *bench.SerializePair
	host     *bench.Serializer
}

func newBaselines(b *testing.B, src []byte) *baselines {
	var err error
	bl := &baselines{src: src, dst: make([]byte, len(src)), host: bench.NewSerializer(src)}
	copy(bl.dst, src) // fault the pages in, as the arenas' are after warm-up
	if bl.raw, err = bench.NewTCPPair(src); err != nil {
		b.Fatal(err)
	}
	if bl.ser, err = bench.NewSerializePair(src); err != nil {
		b.Fatal(err)
	}
	return bl
}

func (bl *baselines) close() { bl.raw.Close(); bl.ser.Close() }

// measure times the baselines of path p once each, adding to r.
func (bl *baselines) measure(b *testing.B, p benchPath, r *ratios) {
	var d time.Duration
	var err error
	if p.network {
		if d, err = bl.raw.Read(bl.dst); err != nil {
			b.Fatal(err)
		}
		r.add("rawtcp", d)
		if d, err = bl.ser.Read(bl.dst); err != nil {
			b.Fatal(err)
		}
	} else {
		r.add("memcpy", bench.Memcpy(bl.dst, bl.src))
		if d, err = bl.host.Read(bl.dst); err != nil {
			b.Fatal(err)
		}
	}
	r.add("serialize", d)
}

// run times one transfer of n bytes over p per iteration, after one
// warm-up (connections, first-touch pages), interleaved with p's
// baselines, and reports the rates and ratios.
func (bl *baselines) run(b *testing.B, p benchPath, n int64, transfer func() time.Duration) {
	b.SetBytes(n)
	b.ReportAllocs()
	transfer()
	var r ratios
	for i := 0; i < b.N; i++ {
		r.path += transfer()
		bl.measure(b, p, &r)
	}
	r.report(b, n)
}

// ratios accumulates the path's time and each baseline's.
type ratios struct {
	path  time.Duration
	names []string
	base  map[string]time.Duration
}

func (r *ratios) add(name string, d time.Duration) {
	if r.base == nil {
		r.base = map[string]time.Duration{}
	}
	if _, ok := r.base[name]; !ok {
		r.names = append(r.names, name)
	}
	r.base[name] += d
}

// report gives the path's rate, and per baseline its rate and the ratio
// (baseline time over path time: above 1, the path is faster).
func (r *ratios) report(b *testing.B, size int64) {
	n := float64(b.N) * float64(size) / 1e9
	b.ReportMetric(n/r.path.Seconds(), "GB/s")
	for _, name := range r.names {
		b.ReportMetric(n/r.base[name].Seconds(), name+"-GB/s")
		b.ReportMetric(r.base[name].Seconds()/r.path.Seconds(), "ratio-vs-"+name)
	}
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

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

var benchSizes = []int64{1 << 20, 64 << 20}

// BenchmarkGet pulls one object over every path (sub-benchmarks
// path/size), each Get checked to have taken its path.
func BenchmarkGet(b *testing.B) {
	e := newBenchEnv(b)
	defer e.stop()
	ctx := context.Background()
	for _, n := range benchSizes {
		ref, src := put(b, e.owner, n)
		bl := newBaselines(b, src)
		for _, p := range e.paths {
			b.Run(p.name+"/"+size(n), func(b *testing.B) {
				bl.run(b, p, n, func() time.Duration { return getOver(b, p.reader, ref, p.dst, p.transport) })
			})
		}
		bl.close()
		e.owner.Free(ctx, ref)
	}
}

// BenchmarkPush pushes one object into a slot each path's reader reserved
// (Reserve once, then Push and Wait per iteration, as weight sync does).
func BenchmarkPush(b *testing.B) {
	e := newBenchEnv(b)
	defer e.stop()
	ctx := context.Background()
	for _, n := range benchSizes {
		ref, src := put(b, e.owner, n)
		bl := newBaselines(b, src)
		for _, p := range e.paths {
			if p.transport == fabric.Local {
				continue // a view: nothing to push
			}
			b.Run(p.name+"/"+size(n), func(b *testing.B) {
				slot, err := p.reader.Reserve(ctx, ref.Desc, p.dst)
				if err != nil {
					b.Fatal(err)
				}
				defer slot.Close()
				var seen uint64
				push := func() time.Duration {
					start := time.Now()
					x, err := e.owner.Push(ctx, ref, slot.Ref())
					if err != nil {
						b.Fatal(err)
					}
					if seen, _, err = slot.Wait(ctx, seen); err != nil {
						b.Fatal(err)
					}
					d := time.Since(start)
					if x.Stats.Transport != p.transport {
						b.Fatalf("the push took %q, the benchmark measures %q", x.Stats.Transport, p.transport)
					}
					return d
				}
				bl.run(b, p, n, push)
			})
		}
		bl.close()
		e.owner.Free(ctx, ref)
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
		r, err := New(ctx, Config{Cluster: cl, Host: host, IgnoreEnv: true, RuntimeDir: b.TempDir(), DeviceMemory: 1 << 30, EncryptData: enc, Transports: stack.Config{DisableRDMA: true}})
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
			var r ratios
			for i := 0; i < b.N; i++ {
				r.path += getOver(b, enc, ref, tensor.GPUDevice(0), fabric.TCP)
				r.add("plain", getOver(b, plain, ref, tensor.GPUDevice(0), fabric.TCP))
			}
			r.report(b, n)
		})
	}
}

// BenchmarkGetView pulls a view that is only part of its allocation (n
// bytes starting 100 bytes past the middle of a 2n-byte buffer) over the
// paths that grant descriptors (shm, p2p-ipc): the owner stages a private
// copy of the view at the first grant. "first-GB/s" is the first Get of a
// fresh object (staging included); GB/s and the ratios are the Gets after
// it, which reuse the copy and should match BenchmarkGet's.
func BenchmarkGetView(b *testing.B) {
	e := newBenchEnv(b)
	defer e.stop()
	ctx := context.Background()
	for _, n := range benchSizes {
		for _, p := range e.paths {
			if p.transport != fabric.SHM && !(p.transport == fabric.P2P && p.reader.rt != e.owner.rt) {
				continue
			}
			b.Run(p.name+"/"+size(n), func(b *testing.B) {
				mem, _ := e.owner.rt.Memory(tensor.GPUDevice(0))
				x, err := tensor.Alloc(ctx, mem, tensor.Uint8, 2*n)
				if err != nil {
					b.Fatal(err)
				}
				view, err := x.Slice(0, n/2+100, n/2+100+n)
				if err != nil {
					b.Fatal(err)
				}
				src, _ := view.SpanBytes()
				for i := range src {
					src[i] = byte(i)
				}
				ref, err := e.owner.Put(ctx, view)
				if err != nil {
					b.Fatal(err)
				}
				defer e.owner.Free(ctx, ref)
				first := getOver(b, p.reader, ref, p.dst, p.transport)
				bl := newBaselines(b, src)
				defer bl.close()
				bl.run(b, p, n, func() time.Duration { return getOver(b, p.reader, ref, p.dst, p.transport) })
				b.ReportMetric(float64(n)/first.Seconds()/1e9, "first-GB/s")
			})
		}
	}
}
