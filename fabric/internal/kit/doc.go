// Package kit is the plumbing every data transport shares, so that a
// transport's own package holds its protocol and little else. Today it
// holds the per-owner connection pool of the reader side (Pool), which
// fabric/tcp and fabric/shm each wrote before, and the defaults ladder of
// the security block every transport's Config embeds (Secure, for
// fabric.Security). The accept loop with its backoff and limits is
// fabric/internal/acceptor, the authenticated handshake
// fabric/internal/peerauth (it takes a fabric.Security directly), and a
// rail's dial from its NIC's own address softrdma.DialFrom.
package kit
