package demo

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// TestMain checks that no test leaves a goroutine behind: the runtimes
// shut down and the requests in flight end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m), testhelp.Libp2pBackground()...)
}
