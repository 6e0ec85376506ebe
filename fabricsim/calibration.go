package fabricsim

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
)

// Calibration is what a machine measured of its own processors, as
// `tensorlane sim calibrate` writes it: the CPU time of moving bytes
// between two of tensorlane's runtimes, of a broadcast chunk beyond its
// bytes, and of a reader's check of what it got. The constants are taken
// from one run of the real code (rdt's Broadcast over softrdma, the
// worker's pattern check), not fitted to the cases they predict; the file
// keeps the machine and the load they were taken at.
type Calibration struct {
	Taken   string `json:"taken"`   // UTC, RFC 3339
	Machine string `json:"machine"` // CPU model and cores
	Cores   int    `json:"cores"`   // what the harness's hosts share
	Load    string `json:"load"`    // /proc/loadavg before and after
	Command string `json:"command"` // how to take it again
	Rounds  int    `json:"rounds"`
	// ByteSeconds, ChunkSeconds, LocalChunkSeconds, LocalByteSeconds and
	// VerifySeconds are CPU's fields (CPU-seconds per byte, per chunk
	// and edge between runtimes, per chunk and per byte of an edge
	// inside one runtime, per byte checked). A file without the local
	// two (taken before they were measured) leaves such edges free.
	ByteSeconds       float64 `json:"byte_seconds"`
	ChunkSeconds      float64 `json:"chunk_seconds"`
	LocalChunkSeconds float64 `json:"local_chunk_seconds,omitempty"`
	LocalByteSeconds  float64 `json:"local_byte_seconds,omitempty"`
	VerifySeconds     float64 `json:"verify_seconds"`
	// Samples are the medians the constants come from, CPU-seconds of
	// the whole process per broadcast (large and small chunks) and per
	// check, with what each moved.
	Samples []CalibrationSample `json:"samples"`
	// Handoff is CPU's field of that name, per transport, with how it
	// was measured: wall time between real processes, which one process
	// cannot measure of itself, so it has a measurement of its own.
	Handoff map[string]HandoffCalibration `json:"handoff,omitempty"`
}

// HandoffCalibration is one transport's Handoff and how it was measured:
// rdt's Broadcast through real worker processes, one per network
// namespace, links not shaped, the workers allowed that transport only,
// in chunks at window 1 (every chunk stalls its edge) along chains of 1 to
// Cores*2-1 readers, one per process, each chain also simulated
// (HandoffFrom).
type HandoffCalibration struct {
	Handoff
	Taken   string `json:"taken"`
	Load    string `json:"load"`
	Command string `json:"command"`
	Rounds  int    `json:"rounds"`
	// Takes is how many fresh clusters the chains ran on, Rounds each
	// (files from before it were one).
	Takes   int             `json:"takes,omitempty"`
	Chunk   int64           `json:"chunk_bytes"`
	Samples []HandoffSample `json:"samples"`
}

// HandoffSample is one chain of the hand-off measurement.
type HandoffSample struct {
	Processes int     `json:"processes"` // the owner's and one per reader
	Chunks    int     `json:"chunks"`
	Wall      float64 `json:"wall_seconds"` // median of the rounds
	PerChunk  float64 `json:"per_chunk_seconds"`
	// CPU is the workers' CPU-seconds (user and system), median.
	CPU float64 `json:"cpu_seconds"`
	// Takes is each take's median per chunk, the spread that the
	// median over all rounds (PerChunk) sums up.
	Takes []float64 `json:"takes_per_chunk_seconds,omitempty"`
	// Simulated is the simulator's time per chunk of the same chain
	// with the solved Handoff.
	Simulated float64 `json:"simulated_per_chunk_seconds"`
}

// HandoffFrom solves a transport's Handoff from its measured chains:
// simulate(h, processes) is the simulator's time per chunk of the chain
// of that many processes with h.
// StallSeconds is what the simulator lacks of the chain with exactly as
// many processes as cores, HandoffSeconds the growth of what it lacks per
// process beyond the cores through that chain (least squares); since a
// stall changes what else the cores do meanwhile, the two are solved
// again on the simulation with them until it matches (a few rounds). It
// fills each sample's Simulated with the last simulation, and needs the
// chain of as many processes as cores and a longer one.
func HandoffFrom(cores int, samples []HandoffSample, simulate func(h Handoff, processes int) (float64, error)) (Handoff, error) {
	var h Handoff
	has := func(p func(int) bool) bool {
		return slices.ContainsFunc(samples, func(s HandoffSample) bool { return p(s.Processes) })
	}
	if !has(func(n int) bool { return n == cores }) || !has(func(n int) bool { return n > cores }) {
		return h, fmt.Errorf("%w: the hand-off needs a chain of %d processes and a longer one (got %+v)", ErrBadSpec, cores, samples)
	}
	for range 12 {
		base, num, den, worst := 0.0, 0.0, 0.0, 0.0
		for i := range samples {
			s := &samples[i]
			var err error
			if s.Simulated, err = simulate(h, s.Processes); err != nil {
				return h, err
			}
			if s.Processes == cores {
				base = s.PerChunk - s.Simulated
			}
			if s.Processes >= cores {
				worst = max(worst, math.Abs(s.Simulated/s.PerChunk-1))
			}
		}
		if worst < 0.005 {
			break
		}
		for _, s := range samples {
			if x := float64(s.Processes - cores); x > 0 {
				num += x * (s.PerChunk - s.Simulated - base)
				den += x * x
			}
		}
		h.StallSeconds, h.HandoffSeconds = max(0, h.StallSeconds+base), max(0, h.HandoffSeconds+num/den)
	}
	return h, nil
}

// CalibrationSample is one measured cell of a calibration.
type CalibrationSample struct {
	What       string  `json:"what"`
	Bytes      int64   `json:"bytes"`
	Chunks     int     `json:"chunks,omitempty"`
	CPUSeconds float64 `json:"cpu_seconds"`  // median
	Wall       float64 `json:"wall_seconds"` // median
}

// CPU is the calibration as the simulator's processor model, over the
// calibration's cores.
func (c Calibration) CPU() CPU {
	return CPU{Cores: float64(c.Cores), ByteSeconds: c.ByteSeconds, ChunkSeconds: c.ChunkSeconds,
		LocalChunkSeconds: c.LocalChunkSeconds, LocalByteSeconds: c.LocalByteSeconds, VerifySeconds: c.VerifySeconds, Handoff: c.handoffs()}
}

func (c Calibration) handoffs() map[string]Handoff {
	if len(c.Handoff) == 0 {
		return nil
	}
	out := map[string]Handoff{}
	for k, h := range c.Handoff {
		out[k] = h.Handoff
	}
	return out
}

// Validate checks that the constants can drive a simulation.
func (c Calibration) Validate() error {
	if c.Cores <= 0 || c.ByteSeconds <= 0 || c.ChunkSeconds < 0 || c.LocalChunkSeconds < 0 || c.LocalByteSeconds < 0 || c.VerifySeconds < 0 || negativeHandoff(c.handoffs()) {
		return fmt.Errorf("%w: calibration needs cores and a per-byte cost, and no negative cost (cores %d, byte %g, chunk %g, local chunk %g, local byte %g, verify %g, hand-off %v)",
			ErrBadSpec, c.Cores, c.ByteSeconds, c.ChunkSeconds, c.LocalChunkSeconds, c.LocalByteSeconds, c.VerifySeconds, c.handoffs())
	}
	return nil
}

// ReadCalibration reads a calibration file.
func ReadCalibration(path string) (Calibration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Calibration{}, err
	}
	return ParseCalibration(b)
}

// ParseCalibration decodes and validates a calibration.
func ParseCalibration(b []byte) (Calibration, error) {
	var c Calibration
	if err := json.Unmarshal(b, &c); err != nil {
		return Calibration{}, fmt.Errorf("%w: calibration: %v", ErrBadSpec, err)
	}
	return c, c.Validate()
}

//go:embed calib/harness.json
var harnessCalibration []byte

// HarnessCalibration is the calibration committed in
// fabricsim/calib/harness.json: the machine the multihost harness's
// records were taken on.
func HarnessCalibration() Calibration {
	c, err := ParseCalibration(harnessCalibration)
	if err != nil {
		panic("fabricsim: the committed calibration does not parse: " + err.Error())
	}
	return c
}
