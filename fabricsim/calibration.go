package fabricsim

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
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
	// ByteSeconds, ChunkSeconds and VerifySeconds are CPU's fields
	// (CPU-seconds per byte, per chunk and edge, per byte checked).
	ByteSeconds   float64 `json:"byte_seconds"`
	ChunkSeconds  float64 `json:"chunk_seconds"`
	VerifySeconds float64 `json:"verify_seconds"`
	// Samples are the medians the constants come from, CPU-seconds of
	// the whole process per broadcast (large and small chunks) and per
	// check, with what each moved.
	Samples []CalibrationSample `json:"samples"`
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
	return CPU{Cores: float64(c.Cores), ByteSeconds: c.ByteSeconds, ChunkSeconds: c.ChunkSeconds, VerifySeconds: c.VerifySeconds}
}

// Validate checks that the constants can drive a simulation.
func (c Calibration) Validate() error {
	if c.Cores <= 0 || c.ByteSeconds <= 0 || c.ChunkSeconds < 0 || c.VerifySeconds < 0 {
		return fmt.Errorf("%w: calibration needs cores and a per-byte cost, and no negative cost (cores %d, byte %g, chunk %g, verify %g)",
			ErrBadSpec, c.Cores, c.ByteSeconds, c.ChunkSeconds, c.VerifySeconds)
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
