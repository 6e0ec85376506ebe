package tcp

import "github.com/tensorlane/tensorlane/fabric"

var _ fabric.Addressed = (*Transport)(nil)

// AddressOf returns the owner's tcp data address, "" when it serves none.
func (t *Transport) AddressOf(r fabric.Remote) string { return r.Addrs[fabric.TCP] }
