package rdma

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
)

// The verbs-shaped provider interface. It follows ibverbs closely enough
// that a provider over libibverbs (rdma-core) can be added without changing
// its callers: a Provider lists devices (NICs); an opened device (Context)
// allocates protection domains and completion queues; memory is registered
// on a protection domain and named remotely by (RKey, Addr); a connected
// QueuePair posts one-sided READ and WRITE work requests whose completions
// are polled from a CompletionQueue. Simplifications are documented where
// they are made.

// Provider is a source of RDMA devices: the software provider
// (fabric/rdma/softrdma), later ibverbs.
type Provider interface {
	// Name names the provider ("softrdma", "ibverbs").
	Name() string
	// Devices lists the NICs the provider drives.
	Devices() []Device
	// Open opens a device. With cfg.Listen set the device also accepts
	// queue pairs from remote peers and serves their one-sided operations
	// against the memory registered on it (the passive side of RC).
	Open(ctx context.Context, device string, cfg OpenConfig) (Context, error)
}

// Device describes one NIC of a provider.
type Device struct {
	// Name is the NIC's name, matched against the topology's NIC Name or
	// RDMADevice ("nic0", "mlx5_0").
	Name string
	// Addr is the address remote queue pairs connect to when the device
	// listens ("10.1.0.2:4791"); "" for a device that only initiates.
	Addr string
}

// OpenConfig configures an opened device.
type OpenConfig struct {
	// Security: Identity (required) authenticates this end of every queue
	// pair; ClusterKey is the cluster key (rdt.Config.ClusterKey): when set, both
	// ends of every queue pair prove they hold it, and a peer that does
	// not is refused, as on the control channel and the tcp data path (a
	// provider that cannot prove it must fail Open rather than ignore it);
	// AllowPeer admits remote peers on accepted queue pairs (nil: every
	// authenticated peer); Logger. EncryptData must be off (ErrEncrypt): a
	// provider moves registered memory as it is. See fabric.Security.
	fabric.Security
	// Listen makes the device accept remote queue pairs at its Addr.
	Listen bool
	// Handler answers messages (two-sided SEND/RECV, used for the control
	// exchange) that arrive on accepted queue pairs. nil refuses them.
	Handler MessageHandler
	// Limits caps the accepted queue pairs (in total and per peer) and
	// closes those idle for longer than Limits.IdleTimeout; zero values
	// mean fabric's defaults.
	Limits fabric.ListenerLimits
	// ListenerMetrics counts the device's listener (label "rdma/<nic>"),
	// and remote accesses with keys never issued to the peer; nil: not
	// counted.
	ListenerMetrics *fabric.ListenerMetrics
}

// MessageHandler is the passive side's answer to messages sent with
// QueuePair.Call. HandleMessage may run concurrently for messages of one
// queue pair. QPClosed is called once when an accepted queue pair is gone
// (closed, broken or timed out), after every HandleMessage for it returned.
type MessageHandler interface {
	HandleMessage(ctx context.Context, from RemoteQP, msg []byte) ([]byte, error)
	QPClosed(from RemoteQP)
}

// RemoteQP names an accepted queue pair on the passive side.
type RemoteQP struct {
	ID   uint64  // unique within the device
	Peer peer.ID // authenticated remote identity
}

// Context is an opened device (ibv_context).
type Context interface {
	Device() Device
	// Addr is the address the device listens on ("" when it does not).
	Addr() string
	AllocPD() (ProtectionDomain, error)
	// CreateCQ creates a completion queue.
	CreateCQ() (CompletionQueue, error)
	// Close closes the device and everything created from it: queue pairs
	// are flushed, memory is deregistered. Idempotent.
	Close() error
}

// Access says what a registration allows.
type Access uint8

const (
	AccessLocalWrite  Access = 1 << iota // local READ completions may land here
	AccessRemoteRead                     // remote peers may READ
	AccessRemoteWrite                    // remote peers may WRITE
)

// ProtectionDomain groups registrations and queue pairs (ibv_pd).
type ProtectionDomain interface {
	// RegisterMemory registers buf; the region is named locally by LKey
	// and remotely by (RKey, Addr). The provider may access buf until
	// Deregister returns, never after.
	RegisterMemory(buf []byte, access Access) (MemoryRegion, error)
	// CreateQP creates a reliable connected queue pair whose send
	// completions go to cq.
	CreateQP(cq CompletionQueue, cfg QPConfig) (QueuePair, error)
	Close() error
}

// PeerBinder is an optional capability of a ProtectionDomain: it registers
// memory that only queue pairs authenticated as one peer may access
// remotely. A queue pair of any other peer that presents the keys gets a
// remote access error, as for a wrong key. (ibverbs gets the same effect
// with a protection domain, or a type 2 memory window, per remote peer.)
type PeerBinder interface {
	RegisterMemoryFor(buf []byte, access Access, remote peer.ID) (MemoryRegion, error)
}

// MemoryRegion is a registration (ibv_mr).
type MemoryRegion interface {
	LKey() uint32
	RKey() uint32
	// Addr is the address of the region's first byte in the remote
	// address space of its device (an I/O virtual address).
	Addr() uint64
	Len() int
	// Deregister revokes the keys: remote accesses fail with a remote
	// access error from now on. It waits for accesses in progress and is
	// idempotent.
	Deregister() error
}

// QPConfig sizes a queue pair. Zero values mean the defaults.
type QPConfig struct {
	// MaxOutstanding bounds the posted, uncompleted work requests;
	// default 128. Posting more fails with ErrQueueFull.
	MaxOutstanding int
	// Timeout is how long the queue pair may have work outstanding
	// without any progress from the remote before it breaks with
	// StatusRetryExceeded (the RC transport's retry limit); default 10 s.
	Timeout time.Duration
}

// QueuePair is a reliable connected queue pair (ibv_qp, RC).
type QueuePair interface {
	// Connect connects to a remote device's address and authenticates
	// that its owner is want (when not empty).
	Connect(ctx context.Context, addr string, want peer.ID) error
	// PostRead posts a one-sided READ of wr.Length bytes at (wr.RKey,
	// wr.RemoteAddr) into the local region (wr.LKey, wr.LocalAddr). It
	// does not block; the completion arrives on the queue pair's CQ.
	PostRead(wr WorkRequest) error
	// PostWrite posts a one-sided WRITE of the local bytes to the remote.
	PostWrite(wr WorkRequest) error
	// Call sends a message to the remote's MessageHandler and waits for its
	// answer (two-sided SEND/RECV; an ibverbs provider implements it with
	// posted receive buffers).
	Call(ctx context.Context, msg []byte) ([]byte, error)
	// Err is nil while the queue pair works, then the reason it broke.
	Err() error
	// Close flushes outstanding work requests (StatusFlushed) and
	// disconnects. Idempotent.
	Close() error
}

// WorkRequest is one one-sided operation (ibv_send_wr). Its local side is
// one segment (LKey, LocalAddr, Length) or, for a WRITE, a scatter-gather
// list (SGL, ibv_send_wr's sg_list): the remote range of Length bytes at
// (RKey, RemoteAddr) then receives the segments' concatenation, in order,
// as one WRITE, and LKey and LocalAddr are not used.
type WorkRequest struct {
	ID         uint64 // returned in the completion
	LKey       uint32
	LocalAddr  uint64
	Length     uint32 // with SGL: the sum of the segments' lengths
	RKey       uint32
	RemoteAddr uint64
	// SGL, when not empty, is the local memory of a WRITE: at most the
	// queue pair's MaxSGE segments. A segment outside its region
	// completes with StatusLocalProtection, as a single one does; a list
	// longer than MaxSGE, or whose lengths do not add up to Length, is
	// refused by the post (ErrBadSGL), as ibv_post_send refuses it.
	SGL []Segment
}

// Segment is one piece of local memory of a work request (ibv_sge).
type Segment struct {
	LKey   uint32
	Addr   uint64
	Length uint32
}

// SGELimit is the optional capability of an opened device whose queue
// pairs post WRITEs of several local segments (WorkRequest.SGL). MaxSGE is
// the most segments one work request may have (verbs' max_sge; libfabric's
// tx_attr->iov_limit). A Context without it takes one segment.
type SGELimit interface {
	MaxSGE() int
}

// MaxSGE is the most segments c's queue pairs take in one WRITE: its
// SGELimit, else 1.
func MaxSGE(c Context) int {
	if l, ok := c.(SGELimit); ok {
		return max(l.MaxSGE(), 1)
	}
	return 1
}

// CheckSGL checks wr's scatter-gather list against the queue pair's limit
// (for providers' posts): at most max segments whose lengths add up to
// wr.Length, and only on a WRITE.
func CheckSGL(wr WorkRequest, op Opcode, max int) error {
	if len(wr.SGL) == 0 {
		return nil
	}
	if op != OpWrite {
		return fmt.Errorf("%w: a %v takes one local segment", ErrBadSGL, op)
	}
	if len(wr.SGL) > max {
		return fmt.Errorf("%w: %d segments, the queue pair takes %d", ErrBadSGL, len(wr.SGL), max)
	}
	var n uint64
	for _, s := range wr.SGL {
		n += uint64(s.Length)
	}
	if n != uint64(wr.Length) {
		return fmt.Errorf("%w: segments of %d bytes for a request of %d", ErrBadSGL, n, wr.Length)
	}
	return nil
}

// CompletionQueue delivers completions (ibv_cq with a completion channel).
type CompletionQueue interface {
	// Poll moves up to len(wc) completions into wc and returns how many;
	// it does not block.
	Poll(wc []Completion) int
	// Wait blocks until at least one completion is ready or ctx is done.
	Wait(ctx context.Context) error
	Close() error
}

// Opcode is the operation a completion is for.
type Opcode uint8

const (
	OpRead Opcode = iota + 1
	OpWrite
)

func (o Opcode) String() string {
	switch o {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Status is a completion status (ibv_wc_status).
type Status uint8

const (
	StatusSuccess         Status = iota
	StatusLocalProtection        // the local key or range is not valid
	StatusRemoteAccess           // the remote key is unknown, revoked, or the range or access is not allowed
	StatusRemoteInvalid          // the remote refused a malformed request
	StatusRetryExceeded          // no progress from the remote within the timeout: the queue pair broke
	StatusFlushed                // the queue pair broke or closed before the request completed
	StatusCorrupt                // a frame failed its checksum (software provider)
)

var statusNames = [...]string{"success", "local protection error", "remote access error",
	"remote invalid request", "transport retry exceeded", "flushed", "corrupt frame"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Completion reports the end of one work request (ibv_wc).
type Completion struct {
	ID     uint64
	Op     Opcode
	Status Status
	Bytes  int
	Err    error // detail for a failed completion
}

// Errors of the provider interface.
var (
	ErrQueueFull = errors.New("rdma: send queue full")
	ErrNotConn   = errors.New("rdma: queue pair not connected")
	ErrNoDevice  = errors.New("rdma: no such device")
	// ErrBadSGL: a posted work request's scatter-gather list has more
	// segments than the queue pair takes, lengths that do not add up to
	// its Length, or is on an operation that takes one segment (READ).
	ErrBadSGL = errors.New("rdma: bad scatter-gather list")
	// ErrEncrypt: a Config asked for encryption, which rdma does not do
	// (bytes move between registered memories as they are); tcp serves
	// a runtime that must encrypt.
	ErrEncrypt = errors.New("rdma: EncryptData is set, and rdma does not encrypt")
)
