package fabric

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// DefaultStallTimeout is Security.StallTimeout's default.
const DefaultStallTimeout = 30 * time.Second

// Security is the block every data transport's Config embeds (tcp, shm,
// rdma, readers and servers alike): who this runtime is, what each data
// connection proves, whom a server admits, how long a transfer may make no
// progress, and where the transport logs. One runtime hands the same value
// to all of its transports (fabric/stack does), so they agree on it.
type Security struct {
	// Identity is the runtime's libp2p key: every data connection (and
	// rdma queue pair) authenticates both ends against it. Required.
	Identity crypto.PrivKey
	// ClusterKey is the cluster key (32 bytes, or nil): when set, both
	// ends of every data connection prove they hold it (a pre-shared key
	// in the handshake), and a peer that does not is refused, as on the
	// control channel. The names here are the configuration schema's
	// (rdt/schema: cluster_key, encrypt_data, allow_peers).
	ClusterKey []byte
	// EncryptData encrypts the data connections of a path that moves
	// tensor bytes over its socket (tcp; a server with EncryptData refuses
	// readers without it). shm moves no tensor byte over its socket and
	// ignores it; rdma does not encrypt and refuses to start with it.
	EncryptData bool
	// AllowPeer admits a peer's connections to a server (the check a
	// runtime builds from its allow_peers); nil admits every authenticated
	// peer. Readers do not use it.
	AllowPeer func(peer.ID) error
	// StallTimeout fails a transfer that makes no progress for this long
	// (a peer that stopped reading or answering); default 30 s. Transports
	// that bound progress otherwise (rdma's QPTimeout) document so.
	StallTimeout time.Duration
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// ErrNoIdentity is returned by Security.Defaults without an Identity.
var ErrNoIdentity = errors.New("no Identity")

// Defaults validates s and fills in its defaults, once, where a transport
// checks its Config; component names the Config in errors ("tcp: Config").
func (s *Security) Defaults(component string) error {
	if s.Identity == nil {
		return fmt.Errorf("%s: %w", component, ErrNoIdentity)
	}
	if s.ClusterKey != nil && len(s.ClusterKey) != 32 {
		return fmt.Errorf("%s: the cluster key must be 32 bytes, got %d", component, len(s.ClusterKey))
	}
	if s.StallTimeout <= 0 {
		s.StallTimeout = DefaultStallTimeout
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
