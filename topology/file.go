package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// The topology file is the JSON form of a Cluster, the way NCCL's topology
// dump and override files work: `tensorlane topo --dump` (or Dump)
// writes what was discovered, and Load reads it back unchanged, so a
// machine's model can be saved, edited, checked into a test, or handed to
// the scheduler on a machine that is not the one described.
//
//	{
//	  "format": "tensorlane-topology",
//	  "version": 1,
//	  "name": "dgx-h100-x1",
//	  "hosts": [
//	    {
//	      "id": "h0",
//	      "labels": {"topology.tensorlane.io/rack": "rack0"},
//	      "numa": [{"id": 0, "cpus": "0-55,112-167", "distances": [10, 21]}],
//	      "pcie_switches": [{"id": "rp0", "numa": 0}, {"id": "sw0", "numa": 0, "parent": "rp0"}],
//	      "devices": [{"index": 0, "kind": "gpu", "vendor": "nvidia", "model": "H100-SXM5-80GB",
//	                   "memory_bytes": 85899345920, "numa": 0, "pcie_switch": "sw0"}],
//	      "nics": [{"name": "ibp25s0", "rdma_device": "mlx5_0", "speed_gbps": 400, "numa": 0,
//	                "pcie_switch": "sw0"}],
//	      "links": [{"a": 0, "b": 1, "kind": "nvlink", "lanes": 18, "gbps": 450}]
//	    }
//	  ]
//	}
//
// Field names are those of the Go types' json tags. Unknown fields are an
// error (a misspelt override must not be ignored silently). A NUMA value of
// -1 means "no NUMA affinity". Bandwidths: NIC speed_gbps in gigabits per
// second, link gbps in gigabytes per second, one direction.

// FileFormat and FileVersion identify the topology file format.
const (
	FileFormat  = "tensorlane-topology"
	FileVersion = 1
)

// MaxFileBytes bounds what Load reads.
const MaxFileBytes = 64 << 20

// ErrBadFile is wrapped by every error Load returns for malformed input.
var ErrBadFile = errors.New("topology: bad topology file")

// FileError reports a topology file that could not be read, with the file
// name when there is one.
type FileError struct {
	Path string // "" for a reader
	Err  error
}

func (e *FileError) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

type fileDoc struct {
	Format  string  `json:"format"`
	Version int     `json:"version"`
	Name    string  `json:"name"`
	Hosts   []*Host `json:"hosts"`
}

// Dump writes the cluster as an indented topology file.
func Dump(w io.Writer, c *Cluster) error {
	if c == nil {
		return fmt.Errorf("topology: dump of a nil cluster")
	}
	b, err := Marshal(c)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Marshal returns the cluster as an indented topology file.
func Marshal(c *Cluster) ([]byte, error) {
	if c == nil {
		return nil, fmt.Errorf("topology: marshal of a nil cluster")
	}
	hosts := c.Hosts
	if hosts == nil {
		hosts = []*Host{}
	}
	b, err := json.MarshalIndent(fileDoc{Format: FileFormat, Version: FileVersion, Name: c.Name, Hosts: hosts}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// DumpFile writes the cluster to the named file.
func DumpFile(path string, c *Cluster) error {
	b, err := Marshal(c)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Load reads a topology file. The result is checked with Validate and for
// values no machine has (negative sizes, cycles in the PCIe tree, links of
// a device to itself); any problem is an error wrapping ErrBadFile.
func Load(r io.Reader) (*Cluster, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, &FileError{Err: fmt.Errorf("%w: %w", ErrBadFile, err)}
	}
	c, err := Unmarshal(b)
	if err != nil {
		return nil, &FileError{Err: err}
	}
	return c, nil
}

// LoadFile reads the named topology file.
func LoadFile(path string) (*Cluster, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: %w", ErrBadFile, err)}
	}
	defer f.Close()
	c, err := Load(f)
	if err != nil {
		var fe *FileError
		if errors.As(err, &fe) {
			fe.Path = path
		}
		return nil, err
	}
	return c, nil
}

// Unmarshal parses a topology file held in memory; see Load.
func Unmarshal(b []byte) (*Cluster, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrBadFile, MaxFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var doc fileDoc
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the top-level object", ErrBadFile)
	}
	if doc.Format != FileFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrBadFile, doc.Format, FileFormat)
	}
	if doc.Version != FileVersion {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrBadFile, doc.Version, FileVersion)
	}
	c := &Cluster{Name: doc.Name, Hosts: doc.Hosts}
	if err := checkSane(c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	return c, nil
}

// Limits on values a loaded file may hold.
const (
	maxNUMA    = 1 << 12
	maxIndex   = 1 << 16
	maxLanes   = 1 << 10
	maxHosts   = MaxPresetHosts
	maxPerHost = 1 << 14
)

// checkSane rejects values that no machine has, which Validate does not
// look at.
func checkSane(c *Cluster) error {
	if len(c.Hosts) > maxHosts {
		return fmt.Errorf("%d hosts is more than %d", len(c.Hosts), maxHosts)
	}
	for i, h := range c.Hosts {
		if h == nil {
			return fmt.Errorf("host %d is null", i)
		}
		if len(h.Devices) > maxPerHost || len(h.NICs) > maxPerHost || len(h.Switches) > maxPerHost ||
			len(h.Links) > maxPerHost || len(h.NUMA) > maxNUMA {
			return fmt.Errorf("host %s: too many entries", h.ID)
		}
		numaIDs := map[int]bool{}
		for _, n := range h.NUMA {
			if n.ID < 0 || n.ID >= maxNUMA || numaIDs[n.ID] {
				return fmt.Errorf("host %s: bad or duplicate NUMA node id %d", h.ID, n.ID)
			}
			numaIDs[n.ID] = true
			if n.MemoryBytes < 0 || len(n.Distances) > maxNUMA {
				return fmt.Errorf("host %s: NUMA node %d: bad memory or distances", h.ID, n.ID)
			}
			for _, d := range n.Distances {
				if d < 0 || d > 255 {
					return fmt.Errorf("host %s: NUMA node %d: distance %d out of 0..255", h.ID, n.ID, d)
				}
			}
		}
		numaOK := func(n int) bool { return n >= -1 && n < maxNUMA }
		sw := map[string]PCIeSwitch{}
		for _, s := range h.Switches {
			if s.ID == "" {
				return fmt.Errorf("host %s: PCIe switch without id", h.ID)
			}
			if _, dup := sw[s.ID]; dup {
				return fmt.Errorf("host %s: duplicate PCIe switch %q", h.ID, s.ID)
			}
			if !numaOK(s.NUMA) {
				return fmt.Errorf("host %s: switch %s: bad NUMA %d", h.ID, s.ID, s.NUMA)
			}
			sw[s.ID] = s
		}
		for _, s := range h.Switches {
			seen := map[string]bool{}
			for id := s.ID; id != ""; id = sw[id].Parent {
				if seen[id] {
					return fmt.Errorf("host %s: PCIe switch %s: cycle through %s", h.ID, s.ID, id)
				}
				seen[id] = true
				if _, ok := sw[id]; !ok {
					return fmt.Errorf("host %s: PCIe switch parent %q unknown", h.ID, id)
				}
			}
		}
		for _, d := range h.Devices {
			if d.Index < 0 || d.Index >= maxIndex {
				return fmt.Errorf("host %s: device index %d out of 0..%d", h.ID, d.Index, maxIndex-1)
			}
			if d.MemoryBytes < 0 || !numaOK(d.NUMA) {
				return fmt.Errorf("host %s: device %d: bad memory or NUMA", h.ID, d.Index)
			}
			if d.PCIe != nil && (d.PCIe.Width < 0 || d.PCIe.GTps < 0 || math.IsNaN(d.PCIe.GTps)) {
				return fmt.Errorf("host %s: device %d: bad PCIe link", h.ID, d.Index)
			}
		}
		names := map[string]bool{}
		for _, n := range h.NICs {
			if n.Name == "" || names[n.Name] {
				return fmt.Errorf("host %s: NIC without name or duplicate %q", h.ID, n.Name)
			}
			names[n.Name] = true
			if n.SpeedGbps < 0 || !numaOK(n.NUMA) {
				return fmt.Errorf("host %s: NIC %s: bad speed or NUMA", h.ID, n.Name)
			}
		}
		for _, l := range h.Links {
			if l.A == l.B {
				return fmt.Errorf("host %s: link of device %d to itself", h.ID, l.A)
			}
			if l.Lanes < 0 || l.Lanes > maxLanes || l.GBps < 0 {
				return fmt.Errorf("host %s: link %d-%d: bad lanes or bandwidth", h.ID, l.A, l.B)
			}
		}
	}
	return nil
}
