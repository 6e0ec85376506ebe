package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/fabricsim"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// calibrateOptions are the flags of tensorlane sim calibrate.
type calibrateOptions struct {
	out    string
	rounds int
	size   string
}

func newSimCalibrateCmd() *cobra.Command {
	o := calibrateOptions{}
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Measure this machine's CPU cost of moving bytes (the simulator's processor constants)",
		Long: `calibrate runs tensorlane's own code in this process and measures its CPU
time (getrusage, user + system, so other work on the machine changes it
little): rdt's Broadcast from one runtime to a reader in another, over
softrdma on loopback, in 4 MiB and in 64 KiB chunks and once in a single
small chunk, the same to two slots of the reader (the second fed from the
first inside its runtime, as a harness host's later readers are), rounds
interleaved; and the worker's check of every byte a Get brought. From the
medians it solves the CPU time per byte between two hosts, per chunk and
edge, per chunk and per byte of an edge inside one runtime, and per byte
checked, and writes them with the
machine and its load as the JSON the simulator reads
(fabricsim.Calibration; the multihost harness's is fabricsim/calib/harness.json).

  tensorlane sim calibrate --out fabricsim/calib/harness.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCalibrate(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.out, "out", "", "write the calibration to this file (default: print it)")
	f.IntVar(&o.rounds, "rounds", 5, "timed rounds per cell, interleaved (the median is kept)")
	f.StringVar(&o.size, "size", "64MiB", "object broadcast in large and small chunks")
	return cmd
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func medianOf(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// calibCell is one broadcast the calibration times: an object, the
// reader's slots, a chunk size.
type calibCell struct {
	name  string
	src   rdt.Ref
	slots []rdt.Ref
	size  int64
	chunk int64
	cpu   []float64
	wall  []float64
}

func (c *calibCell) chunks() int { return int((c.size + c.chunk - 1) / c.chunk) }

func runCalibrate(ctx context.Context, w io.Writer, o calibrateOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	size, err := parseSimSize(o.size)
	if err != nil {
		return err
	}
	if o.rounds < 1 {
		return fmt.Errorf("sim calibrate: --rounds must be at least 1")
	}
	const small = 64 << 10
	if size < 4*small {
		return fmt.Errorf("sim calibrate: --size must be at least 256KiB")
	}
	cal := fabricsim.Calibration{
		Taken:   time.Now().UTC().Format(time.RFC3339),
		Machine: fmt.Sprintf("%s, %d cores", cpuModel(), runtime.NumCPU()),
		Cores:   runtime.NumCPU(),
		Command: "tensorlane sim calibrate --out fabricsim/calib/harness.json",
		Rounds:  o.rounds,
	}
	before := loadAvg()

	// Two runtimes, the owner on h0 and a reader on h1, as two hosts of
	// the harness are; the transport between them is softrdma over
	// loopback (rdt's default in one process).
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		return err
	}
	var rts []*rdt.Runtime
	defer func() {
		for _, r := range rts {
			r.Shutdown(context.Background())
		}
	}()
	for i := range 2 {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cl, Host: cl.Hosts[i].ID, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: 2*size + 16<<20})
		if err != nil {
			return err
		}
		rts = append(rts, r)
		if i > 0 {
			if err := r.Connect(ctx, rts[0].AddrInfo()); err != nil {
				return err
			}
		}
	}
	owner, err := rts[0].Spawn("calibrate-owner")
	if err != nil {
		return err
	}
	reader, err := rts[1].Spawn("calibrate-reader")
	if err != nil {
		return err
	}
	mem, err := rts[0].Memory(tensor.GPUDevice(0))
	if err != nil {
		return err
	}
	put := func(n int64) (rdt.Ref, []byte, *rdt.Slot, error) {
		x, err := tensor.Alloc(ctx, mem, tensor.Uint8, n)
		if err != nil {
			return rdt.Ref{}, nil, nil, err
		}
		p, _ := x.SpanBytes()
		worker.FillPattern(p, 1)
		ref, err := owner.Put(ctx, x)
		if err != nil {
			x.Release()
			return rdt.Ref{}, nil, nil, err
		}
		s, err := reader.Reserve(ctx, ref.Desc, tensor.GPUDevice(0))
		return ref, p, s, err
	}
	bigRef, bigBytes, bigSlot, err := put(size)
	if err != nil {
		return err
	}
	defer bigSlot.Close()
	// A second slot in the reader's runtime, on another device: a
	// broadcast to both feeds it from the first (the host's leader)
	// inside the runtime, the edge a harness host's later readers have.
	nextSlot, err := reader.Reserve(ctx, bigRef.Desc, tensor.GPUDevice(1))
	if err != nil {
		return err
	}
	defer nextSlot.Close()
	both := []rdt.Ref{bigSlot.Ref(), nextSlot.Ref()}
	if p := owner.ExplainBroadcast(bigRef, both); len(p.Nodes) != 2 || p.Nodes[1].Parent != 0 {
		return fmt.Errorf("sim calibrate: a broadcast to two slots of one runtime is not a chain inside it:\n%s", p)
	}
	smallRef, _, smallSlot, err := put(small)
	if err != nil {
		return err
	}
	defer smallSlot.Close()
	one := []rdt.Ref{bigSlot.Ref()}
	cells := []*calibCell{
		{name: "broadcast, 4 MiB chunks", src: bigRef, slots: one, size: size, chunk: 4 << 20},
		{name: "broadcast, 64 KiB chunks", src: bigRef, slots: one, size: size, chunk: small},
		{name: "broadcast of one 64 KiB chunk", src: smallRef, slots: []rdt.Ref{smallSlot.Ref()}, size: small, chunk: small},
		{name: "broadcast to two slots of the reader (one edge inside it), 4 MiB chunks", src: bigRef, slots: both, size: size, chunk: 4 << 20},
		{name: "broadcast to two slots of the reader (one edge inside it), 64 KiB chunks", src: bigRef, slots: both, size: size, chunk: small},
	}
	var verifyCPU, verifyWall []float64
	// Round 0 warms the connections and the slots' pages; rounds are
	// interleaved so that load from elsewhere shifts every cell alike.
	for round := range o.rounds + 1 {
		for _, c := range cells {
			c0, t0 := cpuSeconds(), time.Now()
			res, err := owner.Broadcast(ctx, c.src, c.slots, rdt.BroadcastConfig{ChunkSize: c.chunk})
			if err != nil {
				return err
			}
			if err := res.Err(); err != nil {
				return fmt.Errorf("sim calibrate: %s: %w", c.name, err)
			}
			cpu, wall := cpuSeconds()-c0, time.Since(t0).Seconds()
			if round > 0 {
				c.cpu, c.wall = append(c.cpu, cpu), append(c.wall, wall)
			}
		}
		// The check the harness's reader runs on a Get's bytes.
		c0, t0 := cpuSeconds(), time.Now()
		if bad := worker.CheckPattern(bigBytes, 1); bad >= 0 {
			return fmt.Errorf("sim calibrate: the source differs from its pattern at %d", bad)
		}
		if round > 0 {
			verifyCPU, verifyWall = append(verifyCPU, cpuSeconds()-c0), append(verifyWall, time.Since(t0).Seconds())
		}
	}
	// The reader's slot holds the object: the broadcasts moved it.
	_, x, err := bigSlot.Wait(ctx, 0)
	if err != nil {
		return err
	}
	got, err := x.SpanBytes()
	if err != nil {
		return err
	}
	if bad := worker.CheckPattern(got, 1); bad >= 0 {
		return fmt.Errorf("sim calibrate: the reader's copy differs at %d", bad)
	}
	_, x, err = nextSlot.Wait(ctx, 0)
	if err != nil {
		return err
	}
	if got, err = x.SpanBytes(); err != nil {
		return err
	}
	if bad := worker.CheckPattern(got, 1); bad >= 0 {
		return fmt.Errorf("sim calibrate: the copy fed inside the reader differs at %d", bad)
	}
	for _, c := range cells {
		cal.Samples = append(cal.Samples, fabricsim.CalibrationSample{What: c.name, Bytes: c.size, Chunks: c.chunks(), CPUSeconds: medianOf(c.cpu), Wall: medianOf(c.wall)})
	}
	cal.Samples = append(cal.Samples, fabricsim.CalibrationSample{What: "check of every byte (the harness's reader)", Bytes: size, CPUSeconds: medianOf(verifyCPU), Wall: medianOf(verifyWall)})
	// big = fixed + chunks*c + size*b, for both chunk sizes and for
	// the one small chunk: two differences give c and b.
	large, smallChunks, single := cells[0], cells[1], cells[2]
	cal.ChunkSeconds = max(0, (medianOf(smallChunks.cpu)-medianOf(large.cpu))/float64(smallChunks.chunks()-large.chunks()))
	cal.ByteSeconds = (medianOf(large.cpu) - medianOf(single.cpu) - float64(large.chunks()-1)*cal.ChunkSeconds) / float64(size-small)
	// The edge inside the reader is what the two-slot broadcasts cost
	// beyond the one-slot ones, chunk size by chunk size: per chunk from
	// the two differences, per byte from what is left of the large one.
	dLarge := medianOf(cells[3].cpu) - medianOf(large.cpu)
	dSmall := medianOf(cells[4].cpu) - medianOf(smallChunks.cpu)
	cal.LocalChunkSeconds = max(0, (dSmall-dLarge)/float64(smallChunks.chunks()-large.chunks()))
	cal.LocalByteSeconds = max(0, (dLarge-float64(large.chunks())*cal.LocalChunkSeconds)/float64(size))
	cal.VerifySeconds = medianOf(verifyCPU) / float64(size)
	cal.Load = before + " -> " + loadAvg()
	if err := cal.Validate(); err != nil {
		return fmt.Errorf("sim calibrate: the measurement gives no usable constants (%v); samples %+v", err, cal.Samples)
	}
	data, err := json.MarshalIndent(cal, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if o.out == "" {
		_, err = w.Write(data)
		return err
	}
	// The hand-off is measured between real processes
	// (internal/multihost's TestSimCalibrateHandoff), not here: keep the
	// one the file has for this many cores.
	if old, err := fabricsim.ReadCalibration(o.out); err == nil && old.Cores == cal.Cores && len(old.Handoff) > 0 {
		cal.Handoff = old.Handoff
		if data, err = json.MarshalIndent(cal, "", "  "); err != nil {
			return err
		}
		data = append(data, '\n')
	}
	if err := os.WriteFile(o.out, data, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(w, "calibration written to %s: %.3g CPU-s per byte between hosts (%.0f MB per CPU-second), %.0f µs per chunk and edge, inside a runtime %.1f µs per chunk and %.3g CPU-s per byte, %.3g CPU-s per byte checked; load %s\n",
		o.out, cal.ByteSeconds, 1e-6/cal.ByteSeconds, cal.ChunkSeconds*1e6, cal.LocalChunkSeconds*1e6, cal.LocalByteSeconds, cal.VerifySeconds, cal.Load)
	return nil
}
