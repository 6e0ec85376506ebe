//go:build gpu

package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/bench/devbench"
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/local"
	"github.com/tensorlane/tensorlane/fabric/shm"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
)

// Sizes and rounds, overridable from the environment (GPUCHECK_MIB,
// GPUCHECK_ROUNDS).
func size() int64 {
	if n, err := strconv.ParseInt(os.Getenv("GPUCHECK_MIB"), 10, 64); err == nil && n > 0 {
		return n << 20
	}
	return 256 << 20
}

func rounds() int {
	if n, err := strconv.Atoi(os.Getenv("GPUCHECK_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 15
}

const ownerEnv = "GPUCHECK_OWNER"

func TestMain(m *testing.M) {
	if os.Getenv(ownerEnv) != "" {
		os.Exit(ownerMain())
	}
	if code, ok := devbench.Owner(); ok { // TestBenchRows' owner process
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func open(t *testing.T, dev int, mode cuda.Mode) *cuda.Memory {
	t.Helper()
	m, err := cuda.NewMemory(cuda.Config{Device: dev, Mode: mode})
	if err != nil {
		t.Fatalf("CUDA device %d (%v): %v", dev, mode, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func fill(p []byte, seed byte) {
	for i := range p {
		p[i] = byte(i*131+i>>11) ^ seed
	}
}

func alloc(t *testing.T, m *cuda.Memory, n int64) *cuda.Buffer {
	t.Helper()
	b, err := m.Alloc(context.Background(), n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Release() })
	return b.(*cuda.Buffer)
}

func verify(t *testing.T, b *cuda.Buffer, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if err := b.CopyOut(context.Background(), 0, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("bytes differ from offset %d", i)
	}
}

// measure runs base and path alternately, rounds times after a warm-up,
// and returns the median seconds of each.
func measure(t *testing.T, base, path func() error) (float64, float64) {
	t.Helper()
	var bt, pt []float64
	for i := -2; i < rounds(); i++ {
		for _, c := range []struct {
			f   func() error
			out *[]float64
		}{{base, &bt}, {path, &pt}} {
			start := time.Now()
			if err := c.f(); err != nil {
				t.Fatal(err)
			}
			if i >= 0 {
				*c.out = append(*c.out, time.Since(start).Seconds())
			}
		}
	}
	slices.Sort(bt)
	slices.Sort(pt)
	return bt[len(bt)/2], pt[len(pt)/2]
}

// report prints one RESULT line (the script collects them) and checks the
// goal.
func report(t *testing.T, name string, n int64, baseName string, base, path, goal float64) {
	t.Helper()
	ratio := base / path
	status := "ok"
	if ratio < goal {
		status = "BELOW GOAL"
	}
	line := fmt.Sprintf("RESULT %-22s %5d MiB: path %8.1f GB/s, %s %8.1f GB/s, ratio %.2f (goal >= %.2f) %s",
		name, n>>20, float64(n)/path/1e9, baseName, float64(n)/base/1e9, ratio, goal, status)
	fmt.Println(line)
	if ratio < goal && os.Getenv("GPUCHECK_NO_GOALS") == "" {
		t.Errorf("%s", line)
	}
}

func TestDiscovery(t *testing.T) {
	d, err := cuda.Load("")
	if err != nil {
		t.Fatalf("no usable CUDA driver: %v", err)
	}
	devs, err := d.Devices()
	if err != nil || len(devs) == 0 {
		t.Fatalf("devices: %v (%d)", err, len(devs))
	}
	for _, i := range devs {
		fmt.Printf("DEVICE %d: %s %s bus %s, %d MiB, cc %d.%d, VMM %v fd %v fabric %v GDR %v NUMA %d peers %v\n",
			i.Ordinal, i.Name, i.UUID, i.PCIBusID, i.TotalMemory>>20, i.Compute[0], i.Compute[1], i.VMM, i.PosixFD, i.Fabric, i.GPUDirectRDMA, i.NUMANode, i.Peers)
		if i.TotalMemory <= 0 {
			t.Errorf("device %d reports %d bytes", i.Ordinal, i.TotalMemory)
		}
	}
	fmt.Printf("DRIVER %s CUDA %d VMM %v\n", d.Path(), d.Version(), d.VMM())
}

// Allocation in both modes, Put/Get through the lanes' staging and through
// pinned memory, windows, and a typed out-of-memory error.
func TestAllocPutGet(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []cuda.Mode{cuda.ModeVMM, cuda.ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			m := open(t, 0, mode)
			n := 64<<20 + 123
			want := make([]byte, n)
			fill(want, 1)
			b := alloc(t, m, int64(n))
			if err := b.CopyIn(ctx, 0, want); err != nil {
				t.Fatal(err)
			}
			verify(t, b, want)
			st, err := m.Pinned(ctx, int64(n))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Release()
			if err := tensor.Copy(ctx, st, 0, b, 0, int64(n)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(st.Bytes(), want) {
				t.Fatal("pinned copy differs")
			}
			part := make([]byte, 4096)
			if err := b.CopyOut(ctx, 1<<20+7, part); err != nil || !bytes.Equal(part, want[1<<20+7:1<<20+7+4096]) {
				t.Fatalf("window: %v", err)
			}
			_, err = m.Alloc(ctx, m.Info().TotalMemory*2)
			var oom *tensor.OutOfMemoryError
			if !errors.As(err, &oom) {
				t.Errorf("allocating twice the device: %v, want an OutOfMemoryError", err)
			}
		})
	}
}

// Device-to-device Get on one GPU through the in-process p2p transport,
// against cuMemcpy of the same size.
func TestD2DGet(t *testing.T) {
	ctx := context.Background()
	m := open(t, 0, cuda.ModeAuto)
	n := size()
	want := make([]byte, n)
	fill(want, 2)
	src, dst := alloc(t, m, n), alloc(t, m, n)
	if err := src.CopyIn(ctx, 0, want); err != nil {
		t.Fatal(err)
	}
	claim := fabric.Claim{Object: fabric.ObjectID{1}, Incarnation: 1}
	tr := local.NewP2P(local.Config{Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) {
		return pin{src}, nil
	})})
	remote := fabric.Remote{Claim: claim, Length: n}
	get := func() error { _, err := tr.Read(ctx, remote, dst); return err }
	if err := get(); err != nil {
		t.Fatal(err)
	}
	verify(t, dst, want)
	base, path := measure(t, func() error { return cuda.MemcpyBaseline(dst, src, n) }, get)
	report(t, "d2d-get-1gpu", n, "cuMemcpy", base, path, 0.9)
}

// Peer copies between two GPUs, when there are two.
func TestPeerGet(t *testing.T) {
	d, err := cuda.Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := d.DeviceCount(); c < 2 {
		t.Skip("one GPU: no peer copy to check")
	}
	ctx := context.Background()
	m0, m1 := open(t, 0, cuda.ModeAuto), open(t, 1, cuda.ModeAuto)
	if err := m1.EnablePeerAccess(m0); err != nil {
		t.Logf("peer access: %v (copies are staged by the driver)", err)
	}
	n := size()
	want := make([]byte, n)
	fill(want, 3)
	src, dst := alloc(t, m0, n), alloc(t, m1, n)
	if err := src.CopyIn(ctx, 0, want); err != nil {
		t.Fatal(err)
	}
	get := func() error { return tensor.Copy(ctx, dst, 0, src, 0, n) }
	if err := get(); err != nil {
		t.Fatal(err)
	}
	verify(t, dst, want)
	base, path := measure(t, func() error { return cuda.MemcpyBaseline(dst, src, n) }, get)
	report(t, "peer-copy-2gpus", n, "cuMemcpyPeer", base, path, 0.9)
}

type pin struct{ b tensor.Buffer }

func (p pin) Device() tensor.DeviceID                       { return p.b.Device() }
func (p pin) Len() int64                                    { return p.b.Len() }
func (p pin) Release() error                                { return nil }
func (p pin) Export(a tensor.Access) (tensor.Handle, error) { return tensor.ExportOf(p.b, a) }
func (p pin) Unwrap() (tensor.Buffer, int64)                { return p.b, 0 }

type sinkFunc fabric.SourceFunc

func (f sinkFunc) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return f(ctx, c)
}

type ownerInfo struct {
	Addr, Peer, TCP string
}

// ownerMain is the owner process of the cross-process checks: one object
// of GPUCHECK_OWNER bytes on GPU 0 (mode GPUCHECK_MODE), served over shm
// (p2p) and tcp until stdin closes.
func ownerMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "owner:", err); return 2 }
	n, _ := strconv.ParseInt(os.Getenv(ownerEnv), 10, 64)
	mode := cuda.ModeAuto
	if os.Getenv("GPUCHECK_MODE") == "legacy" {
		mode = cuda.ModeLegacy
	}
	m, err := cuda.NewMemory(cuda.Config{Mode: mode})
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	b, err := m.Alloc(context.Background(), n)
	if err != nil {
		return fail(err)
	}
	p := make([]byte, n)
	fill(p, 4)
	if err := b.(*cuda.Buffer).CopyIn(context.Background(), 0, p); err != nil {
		return fail(err)
	}
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(key)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return pin{b}, nil })
	srv, err := shm.Listen(shm.ServerConfig{Security: fabric.Security{Identity: key}, Source: src, Sink: sinkFunc(src)})
	if err != nil {
		return fail(err)
	}
	defer srv.Close()
	line, _ := json.Marshal(ownerInfo{Addr: srv.Addr(), Peer: id.String()})
	fmt.Println(string(line))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func startOwner(t *testing.T, n int64, mode string) ownerInfo {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), ownerEnv+"="+strconv.FormatInt(n, 10), "GPUCHECK_MODE="+mode)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatal("owner process exited before serving")
	}
	var info ownerInfo
	if err := json.Unmarshal(sc.Bytes(), &info); err != nil {
		t.Fatalf("owner said %q", sc.Text())
	}
	go io.Copy(io.Discard, stdout)
	return info
}

// Cross-process p2p Get on one GPU: the owner's allocation handle crosses
// the authenticated socket, is imported here, and the GPU copies.
func TestCrossProcessP2PGet(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []cuda.Mode{cuda.ModeVMM, cuda.ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			n := size()
			info := startOwner(t, n, mode.String())
			m := open(t, 0, mode)
			dst, scratch := alloc(t, m, n), alloc(t, m, n)
			key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
			cli, err := shm.NewClient(shm.Config{Security: fabric.Security{Identity: key}})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			remote := fabric.Remote{Peer: info.Peer, Addrs: map[string]string{fabric.P2P: info.Addr},
				Claim: fabric.Claim{Object: fabric.ObjectID{7}, Incarnation: 1}, Length: n}
			get := func() error { _, err := cli.P2P().Read(ctx, remote, dst); return err }
			if err := get(); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, n)
			fill(want, 4)
			verify(t, dst, want)
			base, path := measure(t, func() error { return cuda.MemcpyBaseline(scratch, dst, n) }, get)
			report(t, "p2p-get-2procs-"+mode.String(), n, "cuMemcpy", base, path, 0.8)
		})
	}
}

// device→host→tcp→host→device over loopback, against raw TCP of the same
// size (one stream, memory to memory) in the same run.
func TestTCPGet(t *testing.T) {
	ctx := context.Background()
	m := open(t, 0, cuda.ModeAuto)
	n := size()
	want := make([]byte, n)
	fill(want, 5)
	src, dst := alloc(t, m, n), alloc(t, m, n)
	if err := src.CopyIn(ctx, 0, want); err != nil {
		t.Fatal(err)
	}
	okey, oid := newKey(t)
	srv, err := tcp.Listen(tcp.ServerConfig{Security: fabric.Security{Identity: okey}, Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) {
		return pin{src}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rkey, _ := newKey(t)
	tr, err := tcp.New(tcp.Config{Security: fabric.Security{Identity: rkey}, Compression: tcp.CompressOff})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	remote := fabric.Remote{Peer: oid.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{3}, Incarnation: 1}, Length: n}
	get := func() error { _, err := tr.Read(ctx, remote, dst); return err }
	if err := get(); err != nil {
		t.Fatal(err)
	}
	verify(t, dst, want)
	raw := rawTCP(t, n)
	base, path := measure(t, raw, get)
	report(t, "tcp-get-d2h2d", n, "raw-tcp", base, path, 0.7)
}

func newKey(t *testing.T) (crypto.PrivKey, peer.ID) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return k, id
}

// rawTCP is devbench's raw TCP baseline, stopped when the test ends.
func rawTCP(t *testing.T, n int64) func() error {
	read, stop, err := devbench.RawTCP(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return read
}

// The device rows of `tensorlane bench --paths device` (bench/devbench),
// printed here as BENCH lines so the GPU check shows them without
// carrying the command. The goals are judged by the tests above (the same
// measurements); here they are printed only.
func TestBenchRows(t *testing.T) {
	rows, err := devbench.Run(context.Background(), devbench.Config{Sizes: []int64{size()}, Rounds: rounds()})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		fmt.Println("BENCH " + r.String())
	}
}
