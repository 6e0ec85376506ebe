package shm_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/shm"
	"github.com/tensorlane/tensorlane/tensor"
)

// An owner serves an object of its simulated device; a reader (here in the
// same process, normally another one) copies it through the owner's arena,
// which it maps by descriptor.
func Example() {
	ctx := context.Background()
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 8<<20)
	defer mem.Close()
	obj, _ := mem.Alloc(ctx, 1<<20)
	data, _ := tensor.BytesOf(obj)
	copy(data, "weights")

	ownerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ownerID, _ := peer.IDFromPrivateKey(ownerKey)
	srv, err := shm.Listen(shm.ServerConfig{
		Security: fabric.Security{Identity: ownerKey},
		// A real owner resolves the claim in its object table and pins.
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			return pin{obj}, nil
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	readerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	tr, _ := shm.New(shm.Config{Security: fabric.Security{Identity: readerKey}})
	defer tr.Close()
	dst, _ := tensor.NewHostMemory(0).Alloc(ctx, 1<<20)
	defer dst.Release()
	st, err := tr.Read(ctx, fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     ownerID.String(),
		Addrs:    map[string]string{fabric.SHM: srv.Addr()},
		Length:   1 << 20,
	}, dst)
	if err != nil {
		fmt.Println(err)
		return
	}
	got, _ := tensor.BytesOf(dst)
	fmt.Printf("%s moved %d bytes: %q\n", st.Transport, st.Bytes, got[:7])
	// Output: shm moved 1048576 bytes: "weights"
}

// pin lends the object without giving up ownership.
type pin struct{ tensor.Buffer }

func (p pin) Bytes() []byte                                 { b, _ := tensor.BytesOf(p.Buffer); return b }
func (p pin) Export(a tensor.Access) (tensor.Handle, error) { return tensor.ExportOf(p.Buffer, a) }
func (p pin) Release() error                                { return nil }

// A reader fetches many objects of one owner as one batch: one request and
// one reply for all of them (the descriptors ride along), then the copies.
// An object the owner no longer has fails on its own.
func ExampleTransport_ReadBatch() {
	ctx := context.Background()
	mem, _ := tensor.NewSimMemory(tensor.GPUDevice(0), 8<<20)
	defer mem.Close()
	objs := map[fabric.ObjectID]tensor.Buffer{}
	for i := range 3 {
		b, _ := mem.Alloc(ctx, 4096)
		p, _ := tensor.BytesOf(b)
		copy(p, fmt.Sprintf("layer %d", i))
		objs[fabric.ObjectID{byte(i)}] = b
	}
	ownerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	ownerID, _ := peer.IDFromPrivateKey(ownerKey)
	srv, err := shm.Listen(shm.ServerConfig{
		Security: fabric.Security{Identity: ownerKey},
		Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			if b, ok := objs[c.Object]; ok {
				return pin{b}, nil
			}
			return nil, fabric.ErrObjectFreed
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	readerKey, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	tr, _ := shm.New(shm.Config{Security: fabric.Security{Identity: readerKey}})
	defer tr.Close()
	var srcs []fabric.Remote
	var dsts []tensor.Buffer
	for i := range 4 { // the fourth was never there
		srcs = append(srcs, fabric.Remote{
			Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
			Peer:     ownerID.String(),
			Addrs:    map[string]string{fabric.SHM: srv.Addr()},
			Claim:    fabric.Claim{Object: fabric.ObjectID{byte(i)}},
			Length:   4096,
		})
		dst, _ := tensor.NewHostMemory(0).Alloc(ctx, 4096)
		defer dst.Release()
		dsts = append(dsts, dst)
	}
	sts, errs := tr.ReadBatch(ctx, srcs, dsts)
	for i := range srcs {
		if errs[i] != nil {
			fmt.Printf("item %d: %v\n", i, errors.Is(errs[i], fabric.ErrObjectFreed))
			continue
		}
		got, _ := tensor.BytesOf(dsts[i])
		fmt.Printf("item %d: %q, one of %d items coalesced\n", i, got[:7], sts[i].Coalesced)
	}
	fmt.Printf("%d round trip\n", tr.Client().BatchStats().Frames)
	// Output:
	// item 0: "layer 0", one of 4 items coalesced
	// item 1: "layer 1", one of 4 items coalesced
	// item 2: "layer 2", one of 4 items coalesced
	// item 3: true
	// 1 round trip
}
