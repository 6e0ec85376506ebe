package rdma

import (
	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// RailsFor exposes Transport.railsFor to the external tests.
func RailsFor(t *Transport, src fabric.Remote, dstDev tensor.DeviceID) ([]*rail, error) {
	rails, _, err := t.railsFor(src, dstDev)
	return rails, err
}

// Routes is how many railsFor answers t holds.
func Routes(t *Transport) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.routes)
}
