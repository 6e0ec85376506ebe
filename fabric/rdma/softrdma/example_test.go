package softrdma_test

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// A one-sided READ between two software NICs.
func Example() {
	ctx := context.Background()
	prov, _ := softrdma.New(softrdma.Config{NICs: []softrdma.NIC{
		{Name: "a", Addr: "127.0.0.1:0"}, {Name: "b", Addr: "127.0.0.1:0"}}})
	ka, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	idA, _ := peer.IDFromPrivateKey(ka)
	kb, _, _ := crypto.GenerateEd25519Key(rand.Reader)

	// Passive side: register memory for remote reads.
	a, _ := prov.Open(ctx, "a", rdma.OpenConfig{Security: fabric.Security{Identity: ka}, Listen: true})
	defer a.Close()
	pdA, _ := a.AllocPD()
	remote, _ := pdA.RegisterMemory([]byte("hello, rdma"), rdma.AccessRemoteRead)

	// Active side: a queue pair to a, and a READ into local memory.
	b, _ := prov.Open(ctx, "b", rdma.OpenConfig{Security: fabric.Security{Identity: kb}})
	defer b.Close()
	pdB, _ := b.AllocPD()
	buf := make([]byte, 11)
	local, _ := pdB.RegisterMemory(buf, rdma.AccessLocalWrite)
	cq, _ := b.CreateCQ()
	qp, _ := pdB.CreateQP(cq, rdma.QPConfig{})
	if err := qp.Connect(ctx, a.Addr(), idA); err != nil {
		fmt.Println(err)
		return
	}
	defer qp.Close()
	qp.PostRead(rdma.WorkRequest{ID: 1, LKey: local.LKey(), LocalAddr: local.Addr(), Length: 11,
		RKey: remote.RKey(), RemoteAddr: remote.Addr()})
	cq.Wait(ctx)
	wc := make([]rdma.Completion, 1)
	cq.Poll(wc)
	fmt.Println(wc[0].Status, string(buf))
	// Output: success hello, rdma
}
