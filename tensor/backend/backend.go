// Package backend is the registry of device memory back-ends: the one seam
// between the topology's devices and the tensor.Memory that holds their
// bytes. Three are built in:
//
//   - "sim": simulated accelerator memory (tensor.SimMemory, memfd arenas of
//     the device's capacity), for presets and machines without a driver;
//   - "cuda": NVIDIA GPUs through the CUDA driver API (tensor/cuda);
//   - "hip": AMD GPUs through the HIP runtime (tensor/hip).
//
// More register with Register (a vendor's back-end for its device kind).
// Open maps a host's devices to memories: on a discovered host each device
// gets the back-end of its vendor whenever that driver is usable, and
// simulated memory otherwise, saying why; on a preset host (a model) every
// device is simulated; a mode asks for simulated memory, real memory or one
// back-end for every device. Each Device says which back-end holds it and,
// when it is simulated, why, so a runtime can put it in its log, Explain,
// `tensorlane env` and the dashboard.
package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Backend makes the memory of one kind of device.
type Backend interface {
	// Name is short, lower case and stable: "sim", "cuda", "hip".
	Name() string
	// Drives reports whether the back-end drives the host's device d (its
	// kind and vendor), before asking whether the driver is there.
	Drives(d topology.Device) bool
	// Open returns the memory of t's device. An error matching
	// ErrUnavailable says the driver is not usable on this machine (Open
	// in ModeAuto then simulates the device, saying why).
	Open(ctx context.Context, t Target) (tensor.Memory, error)
}

// Target is one device to open.
type Target struct {
	// ID is the device as the runtime names it (kind and host index).
	ID tensor.DeviceID
	// Device is the topology's device: vendor, model, PCI bus ID, memory.
	Device topology.Device
	// Rank is the device's position among the devices this process sees
	// that the back-end drives, in the order the driver numbers them
	// (CUDA_VISIBLE_DEVICES=3,1: device 3 has rank 0). A real back-end
	// finds the driver's ordinal by PCI bus ID and falls back to Rank.
	Rank int
	// Capacity is the simulated capacity (Device.MemoryBytes unless the
	// caller overrides it).
	Capacity int64
	Logger   *slog.Logger
}

// ErrUnavailable matches a back-end's "no usable driver here" (tensor/cuda's
// and tensor/hip's ErrUnavailable match it through UnavailableError).
var ErrUnavailable = errors.New("backend: driver unavailable")

// ErrUnknownBackend: a mode names no registered back-end.
var ErrUnknownBackend = errors.New("backend: unknown back-end")

// UnavailableError is a back-end's refusal with its cause.
type UnavailableError struct {
	Backend string
	Device  tensor.DeviceID
	Err     error
}

func (e *UnavailableError) Error() string {
	if e.Device.Kind == "" {
		return e.Err.Error() // a probe: the driver's own words say it all
	}
	return fmt.Sprintf("backend %s: %v: %v", e.Backend, e.Device, e.Err)
}

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the back-end's own error.
func (e *UnavailableError) Unwrap() error { return e.Err }

var (
	regMu    sync.Mutex
	registry []Backend
)

// Register adds b to the registry (replacing a back-end of the same name),
// typically from an init function of a vendor's package. Real back-ends
// are tried in registration order, after the built-in ones.
func Register(b Backend) {
	regMu.Lock()
	defer regMu.Unlock()
	for i, x := range registry {
		if x.Name() == b.Name() {
			registry[i] = b
			return
		}
	}
	registry = append(registry, b)
}

// Backends lists the registered back-ends, "sim" first.
func Backends() []Backend {
	regMu.Lock()
	defer regMu.Unlock()
	return slices.Clone(registry)
}

// Lookup returns the back-end of that name.
func Lookup(name string) (Backend, bool) {
	for _, b := range Backends() {
		if b.Name() == name {
			return b, true
		}
	}
	return nil, false
}

// EnvMode is the environment variable a runtime reads for Config.Mode
// (unless told to read none).
const EnvMode = "TENSORLANE_DEVICE_BACKEND"

// Modes.
const (
	// ModeAuto: on a discovered host, each device's vendor back-end when
	// its driver is usable, simulated memory otherwise (said in Note); on
	// a preset host, simulated memory.
	ModeAuto = "auto"
	// ModeSim: simulated memory for every device.
	ModeSim = "sim"
	// ModeReal: each device's vendor back-end; an unusable driver, or a
	// device no back-end drives, is an error.
	ModeReal = "real"
	// Any other mode is a back-end's name ("cuda", "hip"): that back-end
	// for every accelerator, whatever the topology says of its vendor (a
	// preset host on a machine with real GPUs: device i is the i-th GPU
	// the driver sees; devices beyond the driver's are simulated, said so
	// in their Note).
)

// Config says which devices to open and how.
type Config struct {
	// Mode is ModeAuto (""), ModeSim, ModeReal or a back-end's name.
	Mode string
	// Host is the topology host whose devices are opened.
	Host *topology.Host
	// Visible are the host indices to open, in the order the driver
	// numbers them (CUDA_VISIBLE_DEVICES order); nil means all, in index
	// order.
	Visible []int
	// Capacity overrides each simulated device's capacity when > 0.
	Capacity int64
	Logger   *slog.Logger
}

// Device is one opened device.
type Device struct {
	ID      tensor.DeviceID
	Memory  tensor.Memory
	Backend string // the back-end that made Memory: "sim", "cuda", "hip"
	// Note says why a device is simulated (a preset host, no driver, the
	// mode), empty for real memory.
	Note string
}

// ModeFromEnv returns $TENSORLANE_DEVICE_BACKEND, or "" when unset.
func ModeFromEnv() string { return strings.TrimSpace(os.Getenv(EnvMode)) }

// Open opens cfg.Host's visible devices. On an error no memory is left
// open. The caller closes the memories that have a Close method.
func Open(ctx context.Context, cfg Config) ([]Device, error) {
	if cfg.Host == nil {
		return nil, errors.New("backend: no host")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	mode, forced, err := parseMode(cfg.Mode)
	if err != nil {
		return nil, err
	}
	order, err := visibleOrder(cfg.Host, cfg.Visible)
	if err != nil {
		return nil, err
	}
	var out []Device
	ok := false
	defer func() {
		if !ok {
			closeAll(out)
		}
	}()
	ranks := map[string]int{}
	for _, d := range order {
		id := tensor.DeviceID{Kind: d.Kind, Index: d.Index}
		capacity := d.MemoryBytes
		if cfg.Capacity > 0 {
			capacity = cfg.Capacity
		}
		t := Target{ID: id, Device: d, Capacity: capacity, Logger: log}
		b, note := choose(mode, forced, cfg.Host, d)
		if b != nil {
			t.Rank = ranks[b.Name()]
			ranks[b.Name()]++
			m, err := b.Open(ctx, t)
			switch {
			case err == nil:
				out = append(out, Device{ID: id, Memory: m, Backend: b.Name()})
				continue
			case mode == ModeAuto && errors.Is(err, ErrUnavailable):
				note = fmt.Sprintf("%s driver not usable: %v", b.Name(), err)
			case forced != nil && errors.Is(err, ErrNoOrdinal):
				// One back-end for a preset's devices: the driver has
				// fewer GPUs than the model, and the rest stay models.
				note = fmt.Sprintf("%s driver has no device for it: %v", b.Name(), err)
			default:
				return nil, fmt.Errorf("backend %s: open %v (%s): %w", b.Name(), id, d.Model, err)
			}
		}
		m, err := tensor.NewSimMemory(id, capacity)
		if err != nil {
			return nil, err
		}
		out = append(out, Device{ID: id, Memory: m, Backend: "sim", Note: note})
	}
	ok = true
	return out, nil
}

// choose picks the back-end for d (nil: simulate) and, when it simulates,
// says why.
func choose(mode string, forced Backend, h *topology.Host, d topology.Device) (Backend, string) {
	switch {
	case forced != nil:
		return forced, ""
	case mode == ModeSim:
		return nil, "simulated as asked (" + EnvMode + "=sim)"
	case mode == ModeAuto && h.Simulated:
		p := h.Preset
		if p == "" {
			p = "a model"
		}
		return nil, fmt.Sprintf("host %s is a preset (%s): its devices are simulated (%s=real or =cuda/hip opens real ones)", h.ID, p, EnvMode)
	}
	for _, b := range Backends() {
		if b.Name() != "sim" && b.Drives(d) {
			return b, ""
		}
	}
	if mode == ModeReal {
		return &refuse{fmt.Errorf("no back-end drives %s %s devices (registered: %s)", d.Vendor, d.Kind, strings.Join(Names(), ", "))}, ""
	}
	return nil, fmt.Sprintf("no back-end drives %s %s devices", d.Vendor, d.Kind)
}

// refuse is the back-end of a device ModeReal cannot open.
type refuse struct{ err error }

func (r *refuse) Name() string                                        { return "none" }
func (r *refuse) Drives(topology.Device) bool                         { return false }
func (r *refuse) Open(context.Context, Target) (tensor.Memory, error) { return nil, r.err }

// Names lists the registered back-ends' names.
func Names() []string {
	var out []string
	for _, b := range Backends() {
		out = append(out, b.Name())
	}
	return out
}

// visibleOrder is the host's devices to open, in the driver's order.
func visibleOrder(h *topology.Host, visible []int) ([]topology.Device, error) {
	if visible == nil {
		out := slices.Clone(h.Devices)
		slices.SortFunc(out, func(a, b topology.Device) int { return cmp.Compare(a.Index, b.Index) })
		return out, nil
	}
	byIndex := map[int]topology.Device{}
	for _, d := range h.Devices {
		byIndex[d.Index] = d
	}
	var out []topology.Device
	seen := map[int]bool{}
	for _, i := range visible {
		d, ok := byIndex[i]
		if !ok {
			return nil, fmt.Errorf("backend: visible device %d: host %s has %d accelerators", i, h.ID, len(h.Devices))
		}
		if !seen[i] {
			seen[i] = true
			out = append(out, d)
		}
	}
	return out, nil
}

func closeAll(devs []Device) {
	for _, d := range devs {
		if c, ok := d.Memory.(interface{ Close() error }); ok {
			c.Close()
		}
	}
}

// Summary is one line for a log or a report: "gpu:0=cuda gpu:1=sim".
func Summary(devs []Device) string {
	var parts []string
	for _, d := range devs {
		parts = append(parts, d.ID.String()+"="+d.Backend)
	}
	return strings.Join(parts, " ")
}

// Prober is the optional capability of a back-end that can say whether its
// driver is usable without opening a device (`tensorlane env`).
type Prober interface {
	Probe(ctx context.Context) (Report, error)
}

// Report is what a back-end's driver says of this machine.
type Report struct {
	Backend string
	Library string
	Version int // the driver's version number as it reports it (12080)
	Devices []ProbedDevice
}

// ProbedDevice is one device a driver sees.
type ProbedDevice struct {
	Ordinal   int
	Name      string
	BusID     string
	Memory    int64
	Shareable bool // allocations export as POSIX fds (VMM)
	Peers     []int
}

// parseMode normalises a mode ("" is auto) and, for a back-end's name,
// returns that back-end.
func parseMode(mode string) (string, Backend, error) {
	mode = strings.ToLower(strings.TrimSpace(mode))
	switch mode {
	case "":
		return ModeAuto, nil, nil
	case ModeAuto, ModeSim, ModeReal:
		return mode, nil, nil
	}
	b, ok := Lookup(mode)
	if !ok {
		return "", nil, fmt.Errorf("%w %q (want auto, sim, real or one of %s)", ErrUnknownBackend, mode, strings.Join(Names(), ", "))
	}
	return mode, b, nil
}

// Choose says, without opening anything, which back-end a runtime in mode
// would give each device of h and why a device would be simulated: the
// back-end's name and, for "sim", the note. usable says whether a named
// back-end's driver is usable (from Probe); nil asks every Prober.
func Choose(ctx context.Context, h *topology.Host, mode string, usable map[string]error) (map[int][2]string, error) {
	mode, forced, err := parseMode(mode)
	if err != nil {
		return nil, err
	}
	if usable == nil {
		usable = map[string]error{}
		for _, b := range Backends() {
			if p, ok := b.(Prober); ok {
				_, err := p.Probe(ctx)
				usable[b.Name()] = err
			}
		}
	}
	out := map[int][2]string{}
	for _, d := range h.Devices {
		b, note := choose(mode, forced, h, d)
		switch {
		case b == nil:
			out[d.Index] = [2]string{"sim", note}
		case usable[b.Name()] != nil && mode == ModeAuto:
			out[d.Index] = [2]string{"sim", fmt.Sprintf("%s driver not usable: %v", b.Name(), usable[b.Name()])}
		default:
			out[d.Index] = [2]string{b.Name(), ""}
		}
	}
	return out, nil
}
