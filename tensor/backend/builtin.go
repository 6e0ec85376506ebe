package backend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/tensor/hip"
	"github.com/tensorlane/tensorlane/topology"
)

func init() {
	Register(Sim{})
	Register(&GPU{BackendName: "cuda", Vendor: "nvidia", API: cuda.CUDA})
	Register(&GPU{BackendName: "hip", Vendor: "amd", API: hip.API, Library: hip.LibraryPath})
}

// Sim is simulated accelerator memory (tensor.SimMemory): every device,
// with its capacity.
type Sim struct{}

// Name is "sim".
func (Sim) Name() string { return "sim" }

// Drives every device.
func (Sim) Drives(topology.Device) bool { return true }

// Open makes a simulated memory of t.Capacity bytes.
func (Sim) Open(_ context.Context, t Target) (tensor.Memory, error) {
	return tensor.NewSimMemory(t.ID, t.Capacity)
}

// GPU is a back-end over a CUDA-shaped driver library (tensor/cuda's
// engine): CUDA for NVIDIA, HIP for AMD, and any other cuda.API.
type GPU struct {
	BackendName string
	Vendor      string // topology.Device.Vendor it drives: "nvidia", "amd"
	API         *cuda.API
	// Library returns the library to open ("" or nil: the API's default).
	Library func() string
	// Config is the template of every memory this back-end opens (lanes,
	// staging, mode); API, Library, Device, ID and Logger are set per
	// device.
	Config cuda.Config
}

// Name is the back-end's name.
func (g *GPU) Name() string { return g.BackendName }

// Drives reports whether d is a GPU of the back-end's vendor.
func (g *GPU) Drives(d topology.Device) bool {
	return d.Kind == tensor.GPU && strings.EqualFold(d.Vendor, g.Vendor)
}

// Open loads the driver, finds t's device among the driver's (by PCI bus
// ID, else by t.Rank) and opens its memory as t.ID.
func (g *GPU) Open(ctx context.Context, t Target) (tensor.Memory, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lib := ""
	if g.Library != nil {
		lib = g.Library()
	}
	drv, err := cuda.LoadAPI(g.API, lib)
	if err != nil {
		return nil, g.unavailable(t, err)
	}
	devs, err := drv.Devices()
	if err != nil {
		return nil, g.unavailable(t, err)
	}
	ord, err := ordinal(devs, t)
	if err != nil {
		// The driver is there but does not see this device (the process
		// was given other GPUs): not usable for it, as a missing driver.
		return nil, &UnavailableError{Backend: g.BackendName, Device: t.ID, Err: err}
	}
	cfg := g.Config
	cfg.API, cfg.Library, cfg.Device, cfg.ID, cfg.Logger = g.API, drv.Path(), ord, t.ID, t.Logger
	m, err := cuda.NewMemory(cfg)
	if err != nil {
		return nil, g.unavailable(t, err)
	}
	return m, nil
}

// unavailable marks a driver's "not usable here" as ErrUnavailable; other
// errors stay what they are.
func (g *GPU) unavailable(t Target, err error) error {
	if errors.Is(err, cuda.ErrUnavailable) {
		return &UnavailableError{Backend: g.BackendName, Device: t.ID, Err: err}
	}
	return err
}

// ErrNoOrdinal: the driver has no device that is t's.
var ErrNoOrdinal = errors.New("backend: the driver sees no such device")

// ordinal is the driver's number for t's device: the device with its PCI
// bus ID, else the one of its rank (the driver numbers the devices the
// process may see in order, as CUDA_VISIBLE_DEVICES lists them).
func ordinal(devs []cuda.DeviceInfo, t Target) (int, error) {
	if want := busID(t.Device.BusID); want != "" {
		for _, d := range devs {
			if busID(d.PCIBusID) == want {
				return d.Ordinal, nil
			}
		}
	}
	if t.Rank < len(devs) {
		return devs[t.Rank].Ordinal, nil
	}
	return 0, fmt.Errorf("%w: %v (bus %q) is device %d of those the process sees, and the driver sees %d", ErrNoOrdinal, t.ID, t.Device.BusID, t.Rank, len(devs))
}

// busID normalises "0000:18:00.0" and "00000000:18:00.0" (NVML's) alike.
func busID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	n, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", n, rest)
}

// Probe says whether the driver is usable, without opening any device:
// the library it loaded and the devices it sees, or why not (an error
// matching ErrUnavailable).
func (g *GPU) Probe(ctx context.Context) (Report, error) {
	lib := ""
	if g.Library != nil {
		lib = g.Library()
	}
	if lib == "" {
		lib = g.API.LibraryPath()
	}
	r := Report{Backend: g.BackendName, Library: lib}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	drv, err := cuda.LoadAPI(g.API, lib)
	if err != nil {
		return r, &UnavailableError{Backend: g.BackendName, Err: err}
	}
	devs, err := drv.Devices()
	if err != nil {
		return r, &UnavailableError{Backend: g.BackendName, Err: err}
	}
	r.Version = drv.Version()
	for _, d := range devs {
		r.Devices = append(r.Devices, ProbedDevice{Ordinal: d.Ordinal, Name: d.Name, BusID: d.PCIBusID, Memory: d.TotalMemory,
			Shareable: d.VMM && d.PosixFD, Peers: d.Peers})
	}
	return r, nil
}
