package harness

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// Run must not leave goroutines behind: runtimes, sockets and baseline
// pairs all close before it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m))
}
