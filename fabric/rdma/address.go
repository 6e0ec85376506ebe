package rdma

import "github.com/tensorlane/tensorlane/fabric"

var _ fabric.Addressed = (*Transport)(nil)

// AddressOf returns the owner's rail list (see FormatAddrs), "" when it
// runs no rdma server.
func (t *Transport) AddressOf(r fabric.Remote) string { return r.Addrs[fabric.RDMA] }
