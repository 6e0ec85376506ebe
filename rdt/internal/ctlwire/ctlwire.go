// Package ctlwire is the wire vocabulary of rdt's control plane that more
// than one of its protocols (or packages) shares: the bounds every decoder
// applies to tokens, strings and refs, and the push-notice protocol's one
// table of message kinds and status bytes.
//
// The numbers here are wire format: a kind or status is never renumbered
// or reused, and a bound may grow only with a versioned change. rdt maps
// each status to its condition (StatusOf, ErrOf: status.go); rdt's push,
// push batch and broadcast (rdt/internal/bcast) encode the bodies.
package ctlwire

// Bounds a decoder applies to what a peer sends.
const (
	MaxToken  = 64   // a capability token
	MaxString = 512  // a host name, an address, an actor name, a reason
	MaxRef    = 4096 // one marshalled ref
)

// Notice kinds: the first byte of a notice on the push protocol.
const (
	Push      byte = 1  // owner → slot runtime: a push into your slot completed
	Chunk     byte = 2  // parent → reader: bytes [off, off+n) of broadcast id landed in your slot
	Prepare   byte = 3  // owner → reader: broadcast id of n bytes in chunks of chunk is coming
	Children  byte = 4  // owner → reader: forward what lands to these slots
	Report    byte = 5  // reader → owner: slot complete (gen), or a child failed (failed, text)
	Consumed  byte = 6  // reader → writer: done with generation gen of slot
	Abort     byte = 7  // owner → reader: broadcast id ends without you
	Probe     byte = 8  // feeder → re-parented reader: do you lack chunk [off, off+n)? (answered 0, or StatusHave)
	PushBatch byte = 16 // owner → slot runtime: many pushes completed
)

// Notice statuses: the answer's first byte.
const (
	StatusOK           byte = 0
	StatusNotFound     byte = 1
	StatusUnauthorized byte = 2
	StatusStale        byte = 3
	StatusRefused      byte = 4 // malformed, or refused for a reason no other status names
	StatusBusy         byte = 5
	StatusItems        byte = 6 // push batch: count status bytes follow, one per item
	StatusHave         byte = 7 // probe: the slot has that chunk already
)

// MaxNotice bounds one notice of the push protocol: a push batch's or a
// broadcast's children notice carries a few refs or items.
const MaxNotice = 64 << 10
