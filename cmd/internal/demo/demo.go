package demo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config is one demo cluster. Its zero value means the defaults documented
// on each field (the same as the command's flags).
type Config struct {
	Preset  string // topology preset of every host (default "dgx-h100")
	Hosts   int    // simulated hosts, one runtime each (default 2)
	Readers int    // reader actors, spread over GPUs and hosts (default 4)
	Tensors int    // weight tensors (default 8)
	Steps   int    // weight-sync steps of Run and RunBroadcast (default 2)
	Size    int64  // bytes of each tensor, a multiple of 8 (default 64 MiB)
	// Logger gets the runtimes' events (default: discarded).
	Logger *slog.Logger
	// LinkMonitor, if set (the dashboard), measures every runtime's data
	// connections and feeds rail health (rdt.Config.Transports.LinkMonitor).
	LinkMonitor *linkstat.Monitor
}

// ErrBadConfig is what NewRig, Run and RunBroadcast return for a Config
// they cannot run.
var ErrBadConfig = errors.New("demo: bad config")

// withDefaults fills in the documented defaults of the zero fields.
func (c Config) withDefaults() Config {
	if c.Preset == "" {
		c.Preset = "dgx-h100"
	}
	for _, f := range []struct {
		v   *int
		def int
	}{{&c.Hosts, 2}, {&c.Readers, 4}, {&c.Tensors, 8}, {&c.Steps, 2}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Size == 0 {
		c.Size = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Transfer is one reader's Get of every tensor in one step.
type Transfer struct {
	Step     int     `json:"step"`
	Reader   string  `json:"reader"`
	Host     string  `json:"host"`
	Device   string  `json:"device"`
	Path     string  `json:"path"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	GBps     float64 `json:"gbps"`
	Verified bool    `json:"verified"`
	// VsMemcpy is GBps over the run's memcpy baseline.
	VsMemcpy float64 `json:"vs_memcpy"`
}

// Result is what Run reports.
type Result struct {
	OK        bool   `json:"ok"`
	Simulated bool   `json:"simulated"`
	Preset    string `json:"preset"`
	Hosts     int    `json:"hosts"`
	// MemcpyGBps is the baseline: one tensor copied in this process.
	MemcpyGBps float64    `json:"memcpy_gbps"`
	Transfers  []Transfer `json:"transfers"`
}

// pattern is the known content of tensor i: every 8-byte word encodes its
// tensor and position, so a misplaced or corrupted chunk cannot verify.
func pattern(p []byte, i int) {
	for off := 0; off+8 <= len(p); off += 8 {
		binary.LittleEndian.PutUint64(p[off:], uint64(i)<<48^uint64(off)*0x9E3779B97F4A7C15)
	}
}

// Run builds the rig, measures the memcpy baseline and runs cfg.Steps
// weight-sync steps. start, if set, gets the baseline before the first
// step; row, if set, gets each reader's transfer as it completes, so a slow
// first step does not look like a hang. An error means the demo could not
// run; a transfer that failed verification shows in Result.OK.
func Run(ctx context.Context, cfg Config, start func(memcpyGBps float64), row func(Transfer)) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	o := cfg.withDefaults()
	rig, err := NewRig(ctx, o)
	if err != nil {
		return nil, err
	}
	defer rig.Close()
	res := &Result{OK: true, Simulated: rig.simulated, Preset: o.Preset, Hosts: o.Hosts}
	// The baseline: one in-process memcpy of a tensor, measured now, on
	// this machine (absolute figures drift; ratios say where a path stands).
	res.MemcpyGBps = rig.MemcpyGBps()
	if start != nil {
		start(res.MemcpyGBps)
	}
	for step := 1; step <= o.Steps; step++ {
		_, err := rig.Step(ctx, step, func(t Transfer) {
			if res.MemcpyGBps > 0 {
				t.VsMemcpy = t.GBps / res.MemcpyGBps
			}
			res.OK = res.OK && t.Verified
			res.Transfers = append(res.Transfers, t)
			if row != nil {
				row(t)
			}
		})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// Rig is the demo's simulated cluster: one runtime per host, a trainer
// holding the weight tensors, and reader actors. Run runs a few steps
// on it; the dashboard command runs steps in a loop.
type Rig struct {
	runtimes  []*rdt.Runtime
	trainer   *rdt.Actor
	refs      []rdt.Ref
	tensors   []tensor.Tensor // the trainer's weights behind refs
	readers   []Reader
	size      int64
	simulated bool
	want      []byte
}

// Reader is one reader actor of the rig and the device it reads onto.
type Reader struct {
	Actor  *rdt.Actor
	Host   string
	Device tensor.DeviceID
}

// Runtimes are the rig's runtimes, one per host; the trainer's is first.
func (d *Rig) Runtimes() []*rdt.Runtime { return d.runtimes }

// Trainer is the actor holding the weights, on the first host's GPU 0.
func (d *Rig) Trainer() *rdt.Actor { return d.trainer }

// Readers are the rig's reader actors.
func (d *Rig) Readers() []Reader { return d.readers }

// NewRig builds the simulated cluster both demo modes (and the dashboard)
// run on: the runtimes, connected, the trainer with cfg.Tensors weight
// tensors of a known pattern, and the readers.
func NewRig(ctx context.Context, cfg Config) (rig *Rig, err error) {
	o := cfg.withDefaults()
	size := o.Size
	if o.Hosts < 1 || o.Readers < 1 || o.Tensors < 1 || o.Steps < 1 || size < 8 || size%8 != 0 {
		return nil, fmt.Errorf("%w: hosts, readers, tensors and steps must be at least 1, the size a positive multiple of 8", ErrBadConfig)
	}
	cluster, err := topology.Preset(o.Preset, o.Hosts)
	if err != nil {
		return nil, err
	}
	d := &Rig{size: size, simulated: cluster.Hosts[0].Simulated, want: make([]byte, size)}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	for _, h := range cluster.Hosts {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h.ID, Logger: o.Logger, Transports: stack.Config{LinkMonitor: o.LinkMonitor},
			RuntimeDir: rdt.ProcessRuntimeDir()})
		if err != nil {
			return nil, err
		}
		d.runtimes = append(d.runtimes, r)
	}
	runtimes := d.runtimes
	for i := 1; i < len(runtimes); i++ {
		if err := runtimes[0].Connect(ctx, runtimes[i].AddrInfo()); err != nil {
			return nil, err
		}
	}

	d.trainer, err = runtimes[0].Spawn("trainer", rdt.WithDevices(tensor.GPUDevice(0)))
	if err != nil {
		return nil, err
	}
	gpu0, err := runtimes[0].Memory(tensor.GPUDevice(0))
	if err != nil {
		return nil, err
	}
	elems := size / tensor.BFloat16.Size()
	for i := 0; i < o.Tensors; i++ {
		w, err := tensor.Alloc(ctx, gpu0, tensor.BFloat16, elems)
		if err != nil {
			return nil, err
		}
		p, _ := w.SpanBytes()
		pattern(p, i)
		ref, err := d.trainer.Put(ctx, w)
		if err != nil {
			return nil, err
		}
		d.refs = append(d.refs, ref)
		d.tensors = append(d.tensors, w)
	}

	// Readers: alternate between the trainer's host (other GPUs) and the
	// other hosts, so the run shows both the device-link and network paths.
	for i := 0; i < o.Readers; i++ {
		rt := runtimes[i%len(runtimes)]
		gpus := len(rt.Devices()) - 1
		dev := tensor.GPUDevice(1 + i/len(runtimes)%max(1, gpus-1))
		if gpus < 2 {
			dev = tensor.GPUDevice(0)
		}
		a, err := rt.Spawn(fmt.Sprintf("reader-%d", i), rdt.WithDevices(dev))
		if err != nil {
			return nil, err
		}
		d.readers = append(d.readers, Reader{a, rt.HostID(), dev})
	}
	return d, nil
}

// Step sends the refs to every reader, as control messages, and has each
// reader Get and verify every tensor.
func (d *Rig) Step(ctx context.Context, step int, done func(Transfer)) ([]Transfer, error) {
	var out []Transfer
	// The refs travel as control messages, as they would between Ray actors.
	for _, rd := range d.readers {
		msg := rdt.Message{Payload: []byte(fmt.Sprintf("sync step %d", step)), Refs: d.refs}
		if err := d.trainer.Send(ctx, rd.Actor.Addr(), msg); err != nil {
			return out, err
		}
	}
	for _, rd := range d.readers {
		msg, err := rd.Actor.Receive(ctx)
		if err != nil {
			return out, err
		}
		t := Transfer{Step: step, Reader: rd.Actor.Name(), Host: rd.Host, Device: rd.Device.String(), Verified: true}
		var elapsed time.Duration
		for i, ref := range msg.Refs {
			start := time.Now()
			got, xfer, err := rd.Actor.Fetch(ctx, ref, rd.Device)
			elapsed += time.Since(start)
			if err != nil {
				return out, fmt.Errorf("%s: get tensor %d: %w", rd.Actor.Name(), i, err)
			}
			t.Path = xfer.Stats.Transport
			t.Bytes += xfer.Stats.Bytes
			p, err := got.SpanBytes()
			pattern(d.want, i)
			if err != nil || !bytes.Equal(p, d.want) {
				t.Verified = false
			}
			got.Release()
		}
		t.Seconds = elapsed.Seconds()
		t.GBps = float64(t.Bytes) / t.Seconds / 1e9
		out = append(out, t)
		done(t)
	}
	return out, nil
}

// MemcpyGBps measures the baseline: the best of three single-threaded
// copies of one tensor's bytes in this process.
func (d *Rig) MemcpyGBps() float64 {
	// Real bytes on both sides: copying untouched memory reads the kernel's
	// shared zero page and would flatter the baseline several times over.
	pattern(d.want, 0)
	dst := make([]byte, len(d.want))
	best := time.Duration(0)
	for range 3 {
		if t := bench.Memcpy(dst, d.want); best == 0 || t < best {
			best = t
		}
	}
	if best <= 0 {
		return 0
	}
	return float64(len(d.want)) / best.Seconds() / 1e9
}

// Drain discards messages left in the readers' inboxes by a failed step.
func (d *Rig) Drain() {
	for _, rd := range d.readers {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_, err := rd.Actor.Receive(ctx)
			cancel()
			if err != nil {
				break
			}
		}
	}
}

// Close shuts every runtime of the rig down.
func (d *Rig) Close() {
	for _, r := range d.runtimes {
		r.Shutdown(context.Background())
	}
}
