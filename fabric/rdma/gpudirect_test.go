package rdma_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/cuda/cudatest"
)

// The GPUDirect decision, from what the provider reports (HMEM, its
// interfaces, dma-buf) and what the device says (its interface, GPUDirect
// RDMA, dma-buf export): register directly, or stage and why.
func TestDecideGPUDirect(t *testing.T) {
	gpu := tensor.GPUDevice(0)
	hmem := rdma.HMEMCaps{Provider: "ofi verbs;ofi_rxm", HMEM: true, Ifaces: []string{"cuda", "rocr"}}
	hmemBuf := hmem
	hmemBuf.DMABuf = true
	cudaGD := rdma.DeviceMemory{Iface: "cuda", Device: gpu, GPUDirectRDMA: true}
	cudaGDBuf := cudaGD
	cudaGDBuf.DMABuf = true
	for _, tc := range []struct {
		name   string
		caps   rdma.HMEMCaps
		mem    rdma.DeviceMemory
		direct bool
		via    string
		reason string
		why    string
	}{
		{"provider without HMEM", rdma.HMEMCaps{Provider: "ofi tcp;ofi_rxm", Note: "fi_getinfo: FI_ENODATA"}, cudaGD, false, "", rdma.StagedNoHMEM, "ofi tcp;ofi_rxm offers no device-memory registration (FI_HMEM/FI_MR_HMEM): fi_getinfo: FI_ENODATA"},
		{"provider that cannot tell (softrdma)", rdma.HMEMCaps{Provider: "softrdma"}, cudaGD, false, "", rdma.StagedNoHMEM, "softrdma offers no"},
		{"HMEM without the device's interface", rdma.HMEMCaps{Provider: "ofi efa", HMEM: true, Ifaces: []string{"cuda"}}, rdma.DeviceMemory{Iface: "rocr", Device: gpu, GPUDirectRDMA: true}, false, "", rdma.StagedNoIface, "not rocr"},
		{"device without GPUDirect RDMA", hmem, rdma.DeviceMemory{Iface: "cuda", Device: gpu}, false, "", rdma.StagedNoGPUDirect, "gpu:0's driver reports no GPUDirect RDMA"},
		{"memory that does not describe itself", hmem, rdma.DeviceMemory{Device: gpu}, false, "", rdma.StagedUnknownMem, "does not say"},
		{"HMEM and GPUDirect: peer memory", hmem, cudaGD, true, "hmem", "", "FI_MR_HMEM (cuda"},
		{"dma-buf on the device only", hmem, cudaGDBuf, true, "hmem", "", "FI_MR_HMEM"},
		{"dma-buf on the provider only", hmemBuf, cudaGD, true, "hmem", "", "FI_MR_HMEM"},
		{"dma-buf on both", hmemBuf, cudaGDBuf, true, "dmabuf", "", "by dma-buf"},
		{"AMD over HMEM", hmem, rdma.DeviceMemory{Iface: "rocr", Device: gpu, GPUDirectRDMA: true}, true, "hmem", "", "(rocr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rdma.DecideGPUDirect(tc.caps, tc.mem)
			if d.Direct != tc.direct || d.Via != tc.via || d.Reason != tc.reason || !strings.Contains(d.Why, tc.why) {
				t.Fatalf("DecideGPUDirect = %+v; want direct %v via %q reason %q, why containing %q", d, tc.direct, tc.via, tc.reason, tc.why)
			}
		})
	}
}

// logLines is a slog handler that keeps the messages and reasons of the
// warnings it gets.
type logLines struct {
	mu    sync.Mutex
	warns []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" || a.Key == "op" {
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.warns = append(l.warns, line)
	l.mu.Unlock()
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

func (l *logLines) staged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, w := range l.warns {
		if strings.Contains(w, "staged through host memory") {
			out = append(out, w)
		}
	}
	return out
}

// CUDA memory (the fake driver) on both ends of rdma over a provider that
// offers no device-memory registration: the bytes arrive through staging,
// and the staging is loud: one warning per side and reason however many
// reads, tensorlane_rdma_device_staged_total{reason} counting every one,
// and Reach's reason (so Explain) saying so for GPU endpoints.
func TestDeviceMemoryStagedLoudly(t *testing.T) {
	cudatest.NoLeaks(t)
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	owner, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	reader, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	const n = 3<<20 + 11
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*5 + i>>9)
	}
	obj, err := owner.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Release()
	if err := obj.(*cuda.Buffer).CopyIn(ctx, 0, want); err != nil {
		t.Fatal(err)
	}
	ownerLog, readerLog := &logLines{}, &logLines{}
	ownerKey, ownerID := key(t)
	srvMetrics := rdma.NewMetrics(prometheus.NewRegistry())
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: newTestProvider(t, "a"),
		Security: fabric.Security{Identity: ownerKey, Logger: slog.New(ownerLog)}, Metrics: srvMetrics,
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return devPin{obj}, nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rk, _ := key(t)
	metrics := rdma.NewMetrics(prometheus.NewRegistry())
	tr, err := rdma.New(ctx, rdma.Config{Provider: newTestProvider(t, "a"), Security: fabric.Security{Identity: rk, Logger: slog.New(readerLog)},
		AllowLoopback: true, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	dst, err := reader.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Release()
	r := fabric.Remote{Endpoint: fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}, Peer: ownerID.String(),
		Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Claim: fabric.Claim{Object: fabric.ObjectID{1}}, Length: n}
	const reads = 3
	for range reads {
		if _, err := tr.Read(ctx, r, dst); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := dst.(*cuda.Buffer).CopyOut(ctx, 0, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("device read over rdma differs")
		}
	}
	if got := testutil.ToFloat64(metrics.DeviceStaged.WithLabelValues(rdma.StagedNoHMEM)); got != reads {
		t.Errorf("reader's staged reads = %v, want %d", got, reads)
	}
	if got := testutil.ToFloat64(srvMetrics.DeviceStaged.WithLabelValues(rdma.StagedNoHMEM)); got < 1 {
		t.Errorf("owner's staged serves = %v, want at least 1 (one per resolve)", got)
	}
	for side, l := range map[string]*logLines{"reader": readerLog, "owner": ownerLog} {
		if w := l.staged(); len(w) != 1 || !strings.Contains(w[0], "reason="+rdma.StagedNoHMEM) {
			t.Errorf("%s's staging warnings = %q, want one with reason %s", side, w, rdma.StagedNoHMEM)
		}
	}
	cost, ok := tr.Reach(fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}, fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)})
	if !ok || !strings.Contains(cost.Reason, "staged through host memory") || !strings.Contains(cost.Reason, "offers no device-memory registration") {
		t.Errorf("Reach's reason for GPU endpoints = %q", cost.Reason)
	}
	cost, _ = tr.Reach(fabric.Endpoint{Host: "h0", Device: tensor.HostDevice}, fabric.Endpoint{Host: "h0", Device: tensor.HostDevice})
	if strings.Contains(cost.Reason, "staged") {
		t.Errorf("Reach's reason between host memory = %q, says staged", cost.Reason)
	}
}

// devPin lends device memory as a pin: not host visible, Unwrap reaches it.
type devPin struct{ b tensor.Buffer }

func (p devPin) Device() tensor.DeviceID        { return p.b.Device() }
func (p devPin) Len() int64                     { return p.b.Len() }
func (p devPin) Release() error                 { return nil }
func (p devPin) Unwrap() (tensor.Buffer, int64) { return p.b, 0 }

// hmemProvider is a provider that says its NICs register CUDA memory.
type hmemProvider struct{ rdma.Provider }

func (hmemProvider) HMEM() rdma.HMEMCaps {
	return rdma.HMEMCaps{Provider: "hmem-test", HMEM: true, Ifaces: []string{"cuda"}}
}

// Where the provider and the device both allow GPUDirect RDMA this version
// still stages, and says so under its own reason: direct_not_wired.
func TestDeviceMemoryStagedEvenWhereDirectWouldDo(t *testing.T) {
	cudatest.NoLeaks(t)
	lib := cudatest.FakeLibrary(t)
	ctx := context.Background()
	mem, err := cuda.NewMemory(cuda.Config{Library: lib, Device: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	const n = 1 << 20
	obj, err := mem.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Release()
	dst, err := mem.Alloc(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Release()
	ownerKey, ownerID := key(t)
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: newTestProvider(t, "a"), Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return devPin{obj}, nil })})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rk, _ := key(t)
	logs := &logLines{}
	metrics := rdma.NewMetrics(prometheus.NewRegistry())
	tr, err := rdma.New(ctx, rdma.Config{Provider: hmemProvider{newTestProvider(t, "a")}, Security: fabric.Security{Identity: rk, Logger: slog.New(logs)},
		AllowLoopback: true, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	r := fabric.Remote{Endpoint: fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}, Peer: ownerID.String(),
		Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Claim: fabric.Claim{Object: fabric.ObjectID{1}}, Length: n}
	if _, err := tr.Read(ctx, r, dst); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(metrics.DeviceStaged.WithLabelValues(rdma.StagedNotWired)); got != 1 {
		t.Errorf("staged with reason %s: %v, want 1", rdma.StagedNotWired, got)
	}
	if w := logs.staged(); len(w) != 1 || !strings.Contains(w[0], rdma.StagedNotWired) {
		t.Errorf("warnings %q", w)
	}
	cost, _ := tr.Reach(fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(0)}, fabric.Endpoint{Host: "h0", Device: tensor.GPUDevice(1)})
	if !strings.Contains(cost.Reason, "hmem-test offers device-memory registration, but this version stages") {
		t.Errorf("Reach's reason = %q", cost.Reason)
	}
}
