package rdma_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/tensor"
)

// An owner serves an object on two loopback rails of the software
// provider; a reader pulls it, striped over both.
func Example() {
	ctx := context.Background()
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 32<<20)
	defer mem.Close()
	obj, _ := mem.Alloc(ctx, 8<<20)
	src, _ := tensor.BytesOf(obj)
	for i := range src {
		src[i] = byte(i)
	}

	ownerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ownerID, _ := peer.IDFromPrivateKey(ownerKey)
	nics := []softrdma.NIC{{Name: "nic0", Addr: "127.0.0.1:0"}, {Name: "nic1", Addr: "127.0.0.1:0"}}
	ownerProv, _ := softrdma.New(softrdma.Config{NICs: nics})
	srv, err := rdma.Listen(ctx, rdma.ServerConfig{Provider: ownerProv, Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) {
			return nopRelease{obj}, nil // a real owner checks the claim and pins
		})})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	readerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	readerProv, _ := softrdma.New(softrdma.Config{NICs: nics})
	tr, _ := rdma.New(ctx, rdma.Config{Provider: readerProv, Security: fabric.Security{Identity: readerKey}, AllowLoopback: true})
	defer tr.Close()

	dst, _ := mem.Alloc(ctx, 8<<20)
	st, err := tr.Read(ctx, fabric.Remote{Peer: ownerID.String(),
		Addrs: map[string]string{fabric.RDMA: srv.Addr()}, Length: 8 << 20}, dst)
	got, _ := tensor.BytesOf(dst)
	rails, _ := rdma.ParseAddrs(srv.Addr())
	fmt.Println(err, st.Transport, len(rails), "rails offered, bytes equal:", bytes.Equal(got, src))
	// Output: <nil> rdma 2 rails offered, bytes equal: true
}
