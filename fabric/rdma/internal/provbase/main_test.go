package provbase

import (
	"testing"

	"go.uber.org/goleak"
)

// The bootstrap test starts accept loops and handler goroutines: none
// may outlive its device.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
