package bcast

import "time"

// Config tunes a broadcast; the zero value means the defaults (rdt
// re-exports it as BroadcastConfig).
type Config struct {
	// ChunkSize is the pipelining unit. Default 4 MiB; at least 64 KiB
	// (each chunk costs a notice round trip per edge).
	ChunkSize int64
	// BusyWait is how long a flow-controlled slot whose reader has not said
	// Done with its generation is waited for before it is skipped with
	// ErrSlotBusy. Default 10 s.
	BusyWait time.Duration
	// Window is how many chunks each edge of the tree keeps in flight,
	// the owner's feeds and the readers' forwards alike: with one, an edge
	// idles for a push and a notice round trip between chunks. Default 4,
	// at most MaxBroadcastWindow. Readers of an older version forward one
	// chunk at a time whatever it says.
	Window int
}

// Defaults returns c with every zero field set to its documented default,
// as Broadcast uses it (a simulator executes the same chunks and window).
func (c Config) Defaults() Config {
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunk
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.BusyWait <= 0 {
		c.BusyWait = DefaultBusyWait
	}
	return c
}

// The defaults and bounds of Config. They are part of the wire contract:
// a reader refuses a prepare notice outside them.
const (
	DefaultChunk    = 4 << 20
	DefaultBusyWait = 10 * time.Second
	// DefaultWindow is Window's default.
	DefaultWindow = 4
	// MaxWindow bounds Window: past a few chunks the edge is full, and
	// each chunk in flight holds a notice stream (a slot runtime keeps 8
	// idle ones per writer) and a transport connection.
	MaxWindow = 16
	// MinChunk is the smallest ChunkSize a broadcast accepts.
	MinChunk = 64 << 10
	// MaxChunks bounds a broadcast's chunk count (its bookkeeping per
	// slot).
	MaxChunks = 1 << 20
)
