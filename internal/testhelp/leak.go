package testhelp

import "go.uber.org/goleak"

// Libp2pBackground are the goroutines libp2p keeps for the life of the
// process once any runtime started one (its tcp reuse manager, NAT
// discovery, the logger's mirror): a goleak check of a package that
// starts runtimes ignores them.
func Libp2pBackground() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/transport/tcpreuse.(*ConnMgr).run"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/nat.DiscoverNAT"),
		goleak.IgnoreTopFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
	}
}
