package stack_test

import (
	"context"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// A runtime's data transports from one Config: here without rdma, so the
// stack serves the in-process paths, shared memory and tcp, and publishes
// the addresses refs carry.
func Example() {
	cl, _ := topology.Preset("dgx-h100", 1)
	key, _, _ := crypto.GenerateEd25519Key(nil)
	objects := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) {
		return nil, fabric.ErrObjectNotFound
	})
	s, err := stack.Start(context.Background(),
		stack.Config{DisableRDMA: true, IgnoreEnv: true},
		stack.Node{Security: fabric.Security{Identity: key}, Cluster: cl, Host: "h0", Process: "example", Source: objects})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	fmt.Println("served:", s.Served())
	_, tcp := s.Addrs()[fabric.TCP]
	fmt.Println("tcp address published:", tcp)
	// Output:
	// served: [local p2p shm tcp]
	// tcp address published: true
}
