package tcp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
)

// An owner serves one object; a reader pulls it over an authenticated,
// checksummed connection, compressed because the dtype says bf16 and the
// reader asked for it.
func Example() {
	ctx := context.Background()
	ownerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	readerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ownerID, _ := peer.IDFromPrivateKey(ownerKey)

	host := tensor.NewHostMemory(0)
	obj, _ := host.Alloc(ctx, 1<<20)
	defer obj.Release()
	data, _ := tensor.BytesOf(obj)
	for i := range data {
		data[i] = byte(i >> 12) // something that compresses
	}
	id := fabric.ObjectID{42}
	srv, err := tcp.Listen(tcp.ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: fabric.SourceFunc(
		func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			if c.Object != id {
				return nil, fabric.ErrObjectNotFound
			}
			return unpinned{obj}, nil
		})})
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	tr, _ := tcp.New(tcp.Config{Security: fabric.Security{Identity: readerKey}, Compression: tcp.CompressAlways})
	defer tr.Close()
	dst, _ := host.Alloc(ctx, 1<<20)
	defer dst.Release()
	st, err := tr.Read(ctx, fabric.Remote{
		Peer: ownerID.String(), Addrs: map[string]string{fabric.TCP: srv.Addr()},
		Claim: fabric.Claim{Object: id}, Length: 1 << 20, DType: tensor.Uint8,
	}, dst)
	got, _ := tensor.BytesOf(dst)
	fmt.Println(st.Transport, st.Bytes, err, bytes.Equal(got, data))
	// Output: tcp 1048576 <nil> true
}

// unpinned lends the object without pinning it (the example owns it).
type unpinned struct{ tensor.Buffer }

func (unpinned) Release() error  { return nil }
func (u unpinned) Bytes() []byte { return u.Buffer.(tensor.HostVisible).Bytes() }
