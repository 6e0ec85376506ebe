package rdma

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/tensorlane/tensorlane/tensor"
)

// GPUDirect RDMA: a NIC reading and writing device memory itself, with no
// staging copy through host memory. Whether a transfer may is decided
// from what the provider says of its NICs (HMEMCaps: libfabric's FI_HMEM
// capability with FI_MR_HMEM registration, the device-memory interfaces it
// was built with, dma-buf) and what the device says of itself
// (DeviceMemory: the driver's GPUDirect RDMA attribute). Where either
// says no, device memory is staged through host memory, loudly: a warning
// once per reason, tensorlane_rdma_device_staged_total{reason}, and a note
// in Explain (Reach's reason). Where both say yes it is staged too, for
// now (StagedNotWired): registering device memory in the data path is not
// written, as no machine this was built on has a libfabric to test it.

// HMEMCaps is what a provider reports about registering device memory
// with its NICs.
type HMEMCaps struct {
	// Provider names it in reasons ("ofi tcp;ofi_rxm").
	Provider string
	// HMEM: the provider offers FI_HMEM and accepts FI_MR_HMEM
	// registrations (fi_getinfo answered hints asking for both).
	HMEM bool
	// Ifaces lists the device-memory interfaces its libfabric drives
	// ("cuda", "rocr"); an HMEM provider without the device's is no use.
	Ifaces []string
	// DMABuf: registrations may name memory by a dma-buf fd (FI_MR_DMABUF,
	// libfabric 1.20 and later), which needs no peer-memory kernel module.
	DMABuf bool
	// Note says why HMEM is off when the provider knows ("fi_getinfo with
	// FI_HMEM: FI_ENODATA").
	Note string
}

// HMEMReporter is the optional capability of a Provider that can tell
// whether its NICs register device memory (ofi). Providers without it
// stage device memory.
type HMEMReporter interface {
	HMEM() HMEMCaps
}

// DeviceMemory is what the device backing a buffer says of itself.
type DeviceMemory struct {
	Iface         string // the libfabric interface that drives it: "cuda", "rocr"
	Device        tensor.DeviceID
	GPUDirectRDMA bool // the driver says the device supports GPUDirect RDMA
	DMABuf        bool // the driver can export its memory as a dma-buf fd
}

// GPUDirectInfo is the optional capability of device buffers (through
// tensor.Unwrap) that describe their device for the GPUDirect decision
// (tensor/cuda, tensor/hip).
type GPUDirectInfo interface {
	GPUDirect() (iface string, rdma, dmabuf bool)
}

// Staging reasons: the label values of tensorlane_rdma_device_staged_total.
const (
	StagedNoHMEM      = "provider_no_hmem"    // the provider offers no FI_MR_HMEM
	StagedNoIface     = "provider_no_iface"   // its libfabric lacks the device's interface
	StagedNoGPUDirect = "device_no_gpudirect" // the device's driver says no
	StagedUnknownMem  = "device_unknown"      // device memory that does not describe itself
	StagedNotWired    = "direct_not_wired"    // both say yes; this version still stages
)

// GPUDirect is the decision for one kind of device memory on one provider.
type GPUDirect struct {
	Direct bool   // the NIC may register the device memory itself
	Via    string // how: "dmabuf" or "hmem" (FI_MR_HMEM with the device's iface)
	Reason string // a label above when staged
	Why    string // in words, for logs and Explain
}

// DecideGPUDirect says whether device memory mem may be registered with
// the NICs of a provider that reports caps, and why not. Table-tested
// (gpudirect_test.go): it needs no GPU.
func DecideGPUDirect(caps HMEMCaps, mem DeviceMemory) GPUDirect {
	prov := caps.Provider
	if prov == "" {
		prov = "the provider"
	}
	switch {
	case mem.Iface == "":
		return GPUDirect{Reason: StagedUnknownMem, Why: fmt.Sprintf("device memory of %v does not say which driver owns it", mem.Device)}
	case !caps.HMEM:
		why := prov + " offers no device-memory registration (FI_HMEM/FI_MR_HMEM)"
		if caps.Note != "" {
			why += ": " + caps.Note
		}
		return GPUDirect{Reason: StagedNoHMEM, Why: why}
	case !hasIface(caps.Ifaces, mem.Iface):
		return GPUDirect{Reason: StagedNoIface, Why: fmt.Sprintf("%s registers device memory of %s, not %s", prov, ifaceList(caps.Ifaces), mem.Iface)}
	case !mem.GPUDirectRDMA:
		return GPUDirect{Reason: StagedNoGPUDirect, Why: fmt.Sprintf("%v's driver reports no GPUDirect RDMA support", mem.Device)}
	case caps.DMABuf && mem.DMABuf:
		return GPUDirect{Direct: true, Via: "dmabuf", Why: fmt.Sprintf("%s registers %v by dma-buf", prov, mem.Device)}
	}
	return GPUDirect{Direct: true, Via: "hmem", Why: fmt.Sprintf("%s registers %v through FI_MR_HMEM (%s; needs the peer-memory module)", prov, mem.Device, mem.Iface)}
}

func hasIface(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func ifaceList(list []string) string {
	if len(list) == 0 {
		return "no device interface"
	}
	return strings.Join(list, ", ")
}

// DeviceMemoryOf describes the device behind b for DecideGPUDirect.
func DeviceMemoryOf(b tensor.Buffer) DeviceMemory {
	root, _ := tensor.Unwrap(b)
	mem := DeviceMemory{Device: b.Device()}
	if g, ok := root.(GPUDirectInfo); ok {
		mem.Iface, mem.GPUDirectRDMA, mem.DMABuf = g.GPUDirect()
	}
	return mem
}

// gpuDirect is a transport's or server's side of the decision: the
// provider's caps (asked once) and a warning once per reason.
type gpuDirect struct {
	prov    Provider
	log     *slog.Logger
	metrics *Metrics // nil: not counted

	once   sync.Once
	hc     HMEMCaps
	warned sync.Map // reason -> struct{}
}

// caps asks the provider once.
func (g *gpuDirect) caps() HMEMCaps {
	g.once.Do(func() {
		g.hc = HMEMCaps{Provider: g.prov.Name(), Note: "the provider cannot tell"}
		if r, ok := g.prov.(HMEMReporter); ok {
			g.hc = r.HMEM()
		}
	})
	return g.hc
}

// staged decides for device buffer b and, as this version always stages
// device memory (direct registration is not wired into the data path),
// counts and reports it: a warning the first time for each reason, a
// debug line after. op says which side ("read", "push", "serve").
func (g *gpuDirect) staged(b tensor.Buffer, op string) GPUDirect {
	d := DecideGPUDirect(g.caps(), DeviceMemoryOf(b))
	if d.Direct {
		d = GPUDirect{Reason: StagedNotWired, Why: d.Why + ", but this version stages device memory through host memory still"}
	}
	if g.metrics != nil {
		g.metrics.DeviceStaged.WithLabelValues(d.Reason).Inc()
	}
	if _, seen := g.warned.LoadOrStore(d.Reason, struct{}{}); !seen {
		g.log.Warn("rdma: device memory staged through host memory (no GPUDirect RDMA)", "device", b.Device(), "op", op, "reason", d.Reason, "why", d.Why)
	} else {
		g.log.Debug("rdma: device memory staged", "device", b.Device(), "op", op, "reason", d.Reason)
	}
	return d
}

// note is Reach's note (so Explain's) for a pair of endpoints of which
// one is on an accelerator: what happens to its memory when the CPU
// cannot address it.
func (g *gpuDirect) note(src, dst tensor.DeviceID) string {
	if src.IsHost() && dst.IsHost() {
		return ""
	}
	caps := g.caps()
	why := caps.Provider + " offers device-memory registration, but this version stages device memory still"
	if !caps.HMEM {
		why = DecideGPUDirect(caps, DeviceMemory{Iface: "cuda"}).Why
	}
	return "; device memory the CPU cannot address is staged through host memory (" + why + ")"
}
