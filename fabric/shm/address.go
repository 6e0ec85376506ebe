package shm

import "github.com/tensorlane/tensorlane/fabric"

var _ fabric.Addressed = (*Transport)(nil)

// AddressOf returns the owner's data socket, "" when it serves neither shm
// nor cross-process p2p (one server serves both names).
func (t *Transport) AddressOf(r fabric.Remote) string { return addrOf(t.name, r) }
