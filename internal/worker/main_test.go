package worker

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: the runtimes
// shut down and the requests in flight end. libp2p keeps a few process-wide
// goroutines of its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/transport/tcpreuse.(*ConnMgr).run"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/nat.DiscoverNAT"),
		goleak.IgnoreTopFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
	)
}
