// Package workerproto is the JSON-lines protocol of `tensorlane worker`:
// the requests a driver writes on the worker's stdin and the replies the
// worker prints on stdout. The worker (cmd/tensorlane) and the multi-host
// test harness (internal/multihost) both use these types, so the two ends
// cannot drift apart. See cmd/internal/worker for the operations.
package workerproto

import "time"

// Request is one command to a worker.
type Request struct {
	ID        int64    `json:"id"`
	Op        string   `json:"op"`
	Size      int64    `json:"size,omitempty"`
	Seed      uint64   `json:"seed,omitempty"`
	Device    string   `json:"device,omitempty"`
	Ref       string   `json:"ref,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Peer      string   `json:"peer,omitempty"`
	Addrs     []string `json:"addrs,omitempty"`
	// NoVerify skips the byte-for-byte check of a get (for throughput runs).
	NoVerify bool `json:"no_verify,omitempty"`
	// Broadcast: the slots' refs, the chunk size; wait: the generation
	// to wait past.
	Refs      []string `json:"refs,omitempty"`
	ChunkSize int64    `json:"chunk_size,omitempty"`
	After     uint64   `json:"after,omitempty"`
	// Broadcast: chunks in flight per tree edge (0: rdt's default).
	Window int `json:"window,omitempty"`
}

// ReaderOutcome is one reader's result of a broadcast.
type ReaderOutcome struct {
	OK         bool   `json:"ok"`
	Fed        string `json:"fed,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Code       string `json:"code,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Reply is a worker's answer, or an event ("ready") it volunteers. Code
// names the typed error on failure.
type Reply struct {
	ID       int64   `json:"id"`
	Event    string  `json:"event,omitempty"`
	OK       bool    `json:"ok"`
	Code     string  `json:"code,omitempty"`
	Error    string  `json:"error,omitempty"`
	Ref      string  `json:"ref,omitempty"`
	Object   string  `json:"object,omitempty"`
	Bytes    int64   `json:"bytes,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
	Path     string  `json:"path,omitempty"`
	Verified bool    `json:"verified,omitempty"`
	Info     *Info   `json:"info,omitempty"`
	// Broadcast: one outcome per reader; wait: the slot's generation.
	Readers    []ReaderOutcome `json:"readers,omitempty"`
	Generation uint64          `json:"generation,omitempty"`
	Tree       string          `json:"tree,omitempty"` // broadcast: the tree it followed (rdt.BroadcastPlan)
}

// Info is a worker's identity and device memory.
type Info struct {
	Pid     int       `json:"pid"`
	Peer    string    `json:"peer"`
	Host    string    `json:"host"`
	Addrs   []string  `json:"addrs"`
	Objects int       `json:"objects"`
	Memory  []Mem     `json:"memory"`
	Used    int64     `json:"used"` // device bytes in use, all devices together
	Allocs  int       `json:"allocs"`
	Devices []string  `json:"devices"`
	Started time.Time `json:"started"`
	Cluster Cluster   `json:"cluster"`
}

// Cluster names the topology the worker's runtime lives in.
type Cluster struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
}

// Mem is one device's memory use.
type Mem struct {
	Device   string `json:"device"`
	Capacity int64  `json:"capacity"`
	Used     int64  `json:"used"`
	Allocs   int    `json:"allocs"`
}
