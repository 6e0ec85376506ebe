package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/bench"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

type demoOptions struct {
	preset  string
	hosts   int
	readers int
	tensors int
	steps   int
	size    string
	json    bool
	verbose bool
	bcast   bool // --broadcast: demo_broadcast.go
	// linkMon, if set (the dashboard), measures every runtime's data
	// connections and feeds rail health (rdt.Config.Transports.LinkMonitor).
	linkMon *linkstat.Monitor
}

func init() {
	o := demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "RL-style weight sync on a simulated cluster built in this process",
		Long: `demo builds a simulated cluster (default: two dgx-h100 hosts, one runtime per host,
talking over loopback), puts bf16 weight tensors with a known pattern on the trainer's
simulated GPU, and has reader actors on other GPUs and on the other host Get them.
Devices are simulated: memfd-backed arenas, with real copies. Exits non-zero if any
transfer fails verification.

--broadcast runs the fleet way instead: each reader reserves a flow-controlled slot per
tensor and sends the slot refs to the trainer, which broadcasts every step's weights to all
readers at once along a topology-aware pipelined tree (ExplainBroadcast's tree is printed);
readers verify every byte and say Done, and the trainer waits for all before the next step.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.bcast {
				return runDemoBroadcast(cmd.Context(), cmd.OutOrStdout(), o)
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "dgx-h100", "topology preset of every host")
	f.IntVar(&o.hosts, "hosts", 2, "number of simulated hosts (one runtime each)")
	f.IntVar(&o.readers, "readers", 4, "number of reader actors, spread over GPUs and hosts")
	f.IntVar(&o.tensors, "tensors", 8, "number of weight tensors")
	f.IntVar(&o.steps, "steps", 2, "weight-sync steps (step 1 also touches the readers' fresh simulated memory)")
	f.StringVar(&o.size, "size", "64MiB", "size of each tensor (KiB, MiB, GiB suffixes)")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.BoolVar(&o.bcast, "broadcast", false, "RL weight sync by broadcast: readers reserve flow-controlled slots, the trainer broadcasts each step's weights to all of them along a pipelined tree, readers verify and say Done")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log runtime events to stderr")
	rootCmd.AddCommand(cmd)
}

type demoTransfer struct {
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

type demoResult struct {
	OK        bool   `json:"ok"`
	Simulated bool   `json:"simulated"`
	Preset    string `json:"preset"`
	Hosts     int    `json:"hosts"`
	// MemcpyGBps is the baseline: one tensor copied in this process.
	MemcpyGBps float64        `json:"memcpy_gbps"`
	Transfers  []demoTransfer `json:"transfers"`
}

// pattern is the known content of tensor i: every 8-byte word encodes its
// tensor and position, so a misplaced or corrupted chunk cannot verify.
func pattern(p []byte, i int) {
	for off := 0; off+8 <= len(p); off += 8 {
		binary.LittleEndian.PutUint64(p[off:], uint64(i)<<48^uint64(off)*0x9E3779B97F4A7C15)
	}
}

// startDemoRig builds the simulated cluster both demo modes run on,
// logging to stderr with -v and nowhere otherwise.
func startDemoRig(ctx context.Context, o demoOptions) (*demoRig, error) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return newDemoRig(ctx, o, logger)
}

func runDemo(ctx context.Context, out io.Writer, o demoOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	rig, err := startDemoRig(ctx, o)
	if err != nil {
		return err
	}
	defer rig.close()
	res := demoResult{OK: true, Simulated: rig.simulated, Preset: o.preset, Hosts: o.hosts}
	// The baseline: one in-process memcpy of a tensor, measured now, on
	// this machine (absolute figures drift; ratios say where a path stands).
	res.MemcpyGBps = rig.memcpyGBps()
	// Rows are printed as they complete: a first step over a slow path
	// must not look like a hang.
	row := func(demoTransfer) {}
	if !o.json {
		fmt.Fprintf(out, "tensorlane demo: %d simulated %s host(s), %d bf16 tensors of %s, %d readers\n",
			o.hosts, o.preset, o.tensors, o.size, o.readers)
		fmt.Fprintln(out, "(simulated devices: memfd-backed arenas, real copies; hosts talk over loopback)")
		fmt.Fprintf(out, "baseline: memcpy of one tensor in this process, %.2f GB/s\n", res.MemcpyGBps)
		const head = "%4s  %-10s  %-4s  %-6s  %-5s  %10s  %8s  %7s  %9s  %s\n"
		fmt.Fprintf(out, head, "step", "reader", "host", "device", "path", "bytes", "seconds", "GB/s", "vs memcpy", "verified")
		row = func(t demoTransfer) {
			fmt.Fprintf(out, "%4d  %-10s  %-4s  %-6s  %-5s  %10s  %8.3f  %7.2f  %8.2fx  %v\n",
				t.Step, t.Reader, t.Host, t.Device, t.Path, humanBytes(t.Bytes), t.Seconds, t.GBps, t.VsMemcpy, t.Verified)
		}
	}
	for step := 1; step <= o.steps; step++ {
		_, err := rig.step(ctx, step, func(t demoTransfer) {
			if res.MemcpyGBps > 0 {
				t.VsMemcpy = t.GBps / res.MemcpyGBps
			}
			res.OK = res.OK && t.Verified
			res.Transfers = append(res.Transfers, t)
			row(t)
		})
		if err != nil {
			return err
		}
	}

	if o.json {
		enc := json.NewEncoder(out)
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else if o.steps > 1 {
		fmt.Fprintln(out, "step 1 includes the first touch of the readers' fresh simulated memory (page population); later steps reuse it")
	}
	if !res.OK {
		return fmt.Errorf("verification failed")
	}
	return nil
}

// demoRig is the demo's simulated cluster: one runtime per host, a trainer
// holding the weight tensors, and reader actors. runDemo runs a few steps
// on it; the dashboard command runs steps in a loop.
type demoRig struct {
	runtimes  []*rdt.Runtime
	trainer   *rdt.Actor
	refs      []rdt.Ref
	tensors   []tensor.Tensor // the trainer's weights behind refs
	readers   []demoReader
	size      int64
	simulated bool
	want      []byte
}

type demoReader struct {
	actor *rdt.Actor
	host  string
	dev   tensor.DeviceID
}

func newDemoRig(ctx context.Context, o demoOptions, logger *slog.Logger) (rig *demoRig, err error) {
	size, err := parseSize(o.size)
	if err != nil {
		return nil, err
	}
	if o.hosts < 1 || o.readers < 1 || o.tensors < 1 || o.steps < 1 {
		return nil, fmt.Errorf("hosts, readers, tensors and steps must be at least 1")
	}
	cluster, err := topology.Preset(o.preset, o.hosts)
	if err != nil {
		return nil, err
	}
	d := &demoRig{size: size, simulated: cluster.Hosts[0].Simulated, want: make([]byte, size)}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	for _, h := range cluster.Hosts {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cluster, Host: h.ID, Logger: logger, Transports: stack.Config{LinkMonitor: o.linkMon},
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
	for i := 0; i < o.tensors; i++ {
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
	for i := 0; i < o.readers; i++ {
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
		d.readers = append(d.readers, demoReader{a, rt.HostID(), dev})
	}
	return d, nil
}

// step sends the refs to every reader, as control messages, and has each
// reader Get and verify every tensor.
func (d *demoRig) step(ctx context.Context, step int, done func(demoTransfer)) ([]demoTransfer, error) {
	var out []demoTransfer
	// The refs travel as control messages, as they would between Ray actors.
	for _, rd := range d.readers {
		msg := rdt.Message{Payload: []byte(fmt.Sprintf("sync step %d", step)), Refs: d.refs}
		if err := d.trainer.Send(ctx, rd.actor.Addr(), msg); err != nil {
			return out, err
		}
	}
	for _, rd := range d.readers {
		msg, err := rd.actor.Receive(ctx)
		if err != nil {
			return out, err
		}
		t := demoTransfer{Step: step, Reader: rd.actor.Name(), Host: rd.host, Device: rd.dev.String(), Verified: true}
		var elapsed time.Duration
		for i, ref := range msg.Refs {
			start := time.Now()
			got, xfer, err := rd.actor.Fetch(ctx, ref, rd.dev)
			elapsed += time.Since(start)
			if err != nil {
				return out, fmt.Errorf("%s: get tensor %d: %w", rd.actor.Name(), i, err)
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

// memcpyGBps measures the baseline: the best of three single-threaded
// copies of one tensor's bytes in this process.
func (d *demoRig) memcpyGBps() float64 {
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

// humanBytes writes n in binary units: "512 MiB", "1.5 GiB".
func humanBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	if f == float64(int64(f)) {
		return fmt.Sprintf("%d %ciB", int64(f), units[i])
	}
	return fmt.Sprintf("%.1f %ciB", f, units[i])
}

// drain discards messages left in the readers' inboxes by a failed step.
func (d *demoRig) drain() {
	for _, rd := range d.readers {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_, err := rd.actor.Receive(ctx)
			cancel()
			if err != nil {
				break
			}
		}
	}
}

func (d *demoRig) close() {
	for _, r := range d.runtimes {
		r.Shutdown(context.Background())
	}
}

func parseSize(s string) (int64, error) {
	var n float64
	var unit string
	if _, err := fmt.Sscanf(s, "%g%s", &n, &unit); err != nil {
		if _, err2 := fmt.Sscanf(s, "%g", &n); err2 != nil {
			return 0, fmt.Errorf("bad size %q", s)
		}
	}
	mult := map[string]float64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
	if mult == 0 || n <= 0 {
		return 0, fmt.Errorf("bad size %q (use e.g. 64MiB)", s)
	}
	v := int64(n * mult)
	return v / 8 * 8, nil // whole 8-byte words, so the pattern covers every byte
}
