package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	srv     *Server
	tr      *Transport
	ownerID peer.ID
	mem     *tensor.SimMemory
	obj     tensor.Buffer
	data    []byte
	token   []byte
	opens   atomic.Int64
}

func newFixture(t testing.TB, size int64, mutate func(*ServerConfig)) *fixture {
	f := &fixture{token: []byte("0123456789abcdef")}
	var err error
	f.mem, err = tensor.NewSimMemory(tensor.GPUDevice(0), size+1<<20)
	require.NoError(t, err)
	f.obj, err = f.mem.Alloc(context.Background(), size)
	require.NoError(t, err)
	f.data, _ = tensor.BytesOf(f.obj)
	for i := range f.data {
		f.data[i] = byte(i*7 + i>>13)
	}
	ownerKey, ownerID := testhelp.Key(t)
	f.ownerID = ownerID
	cfg := ServerConfig{Security: fabric.Security{Identity: ownerKey}, Source: fabric.SourceFunc(func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
		f.opens.Add(1)
		if c.Object != (fabric.ObjectID{1}) {
			return nil, fabric.ErrObjectNotFound
		}
		if !bytes.Equal(c.Token, f.token) {
			return nil, fabric.ErrUnauthorized
		}
		return nopRelease{f.obj}, nil
	})}
	if mutate != nil {
		mutate(&cfg)
	}
	f.srv, err = Listen(cfg)
	require.NoError(t, err)
	readerKey, _ := testhelp.Key(t)
	f.tr, err = New(Config{Security: fabric.Security{Identity: readerKey}, StripeMin: 1 << 20})
	require.NoError(t, err)
	t.Cleanup(func() {
		f.tr.Close()
		f.srv.Close()
		f.mem.Close()
	})
	return f
}

type nopRelease struct{ tensor.Buffer }

func (nopRelease) Release() error  { return nil }
func (b nopRelease) Bytes() []byte { return b.Buffer.(tensor.HostVisible).Bytes() }

func (f *fixture) remote(length int64) fabric.Remote {
	return fabric.Remote{
		Peer: f.ownerID.String(), Addrs: map[string]string{fabric.TCP: f.srv.Addr()},
		Claim: fabric.Claim{Object: fabric.ObjectID{1}, Token: f.token}, Length: length,
	}
}

func (f *fixture) dst(t testing.TB, n int64) tensor.Buffer {
	b, err := tensor.NewHostMemory(0).Alloc(context.Background(), n)
	require.NoError(t, err)
	t.Cleanup(func() { b.Release() })
	return b
}

func TestReadSizes(t *testing.T) {
	f := newFixture(t, 9<<20+123, nil)
	for _, n := range []int64{0, 1, 4096, DefaultChunkSize + 1, 9<<20 + 123} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dst := f.dst(t, n)
			st, err := f.tr.Read(context.Background(), f.remote(n), dst)
			require.NoError(t, err)
			assert.Equal(t, n, st.Bytes)
			got, _ := tensor.BytesOf(dst)
			assert.True(t, bytes.Equal(f.data[:n], got), "bytes differ")
			if n >= 4<<20 {
				assert.Greater(t, st.Streams, 1, "large reads are striped")
			}
		})
	}
}

func TestReadOffsetAndConcurrent(t *testing.T) {
	f := newFixture(t, 4<<20, nil)
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func() {
			r := f.remote(1 << 20)
			r.Offset = int64(i) * 4096
			dst, err := tensor.NewHostMemory(0).Alloc(context.Background(), 1<<20)
			if err != nil {
				errs <- err
				return
			}
			defer dst.Release()
			if _, err := f.tr.Read(context.Background(), r, dst); err != nil {
				errs <- err
				return
			}
			got, _ := tensor.BytesOf(dst)
			if !bytes.Equal(got, f.data[r.Offset:r.Offset+1<<20]) {
				errs <- errors.New("bytes differ")
				return
			}
			errs <- nil
		}()
	}
	for i := 0; i < 16; i++ {
		require.NoError(t, <-errs)
	}
}

func TestReadErrors(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	ctx := context.Background()

	bad := f.remote(100)
	bad.Claim.Token = []byte("forged-token-000")
	_, err := f.tr.Read(ctx, bad, f.dst(t, 100))
	assert.ErrorIs(t, err, fabric.ErrUnauthorized)

	unknown := f.remote(100)
	unknown.Claim.Object = fabric.ObjectID{9}
	_, err = f.tr.Read(ctx, unknown, f.dst(t, 100))
	assert.ErrorIs(t, err, fabric.ErrObjectNotFound)

	outside := f.remote(1 << 20)
	outside.Offset = 1
	_, err = f.tr.Read(ctx, outside, f.dst(t, 1<<20))
	assert.ErrorIs(t, err, fabric.ErrBadRequest)

	_, err = f.tr.Read(ctx, f.remote(1000), f.dst(t, 999))
	assert.ErrorIs(t, err, tensor.ErrTooSmall)

	// The connection survives refused requests: a good read still works.
	_, err = f.tr.Read(ctx, f.remote(1000), f.dst(t, 1000))
	require.NoError(t, err)

	// A server with another identity than the ref names is refused.
	impostor := f.remote(10)
	_, otherID := testhelp.Key(t)
	impostor.Peer = otherID.String()
	_, err = f.tr.Read(ctx, impostor, f.dst(t, 10))
	assert.ErrorIs(t, err, fabric.ErrUnauthorized)

	malformed := f.remote(10)
	malformed.Peer = "not-a-peer-id"
	_, err = f.tr.Read(ctx, malformed, f.dst(t, 10))
	assert.ErrorIs(t, err, fabric.ErrBadRequest)
}

func TestAuthorizeRefusesPeer(t *testing.T) {
	f := newFixture(t, 1024, func(c *ServerConfig) {
		c.AllowPeer = func(peer.ID) error { return errors.New("not on the allowlist") }
	})
	_, err := f.tr.Read(context.Background(), f.remote(10), f.dst(t, 10))
	assert.ErrorIs(t, err, fabric.ErrUnauthorized)
	assert.Equal(t, int64(0), f.opens.Load(), "no object was touched")
}

// misbehavingOwner serves one authenticated connection, reads one request
// and then hands the connection to misbehave. It returns a Remote of length
// n that points at it; the server goroutine ends before the test does.
func misbehavingOwner(t *testing.T, n int64, misbehave func(net.Conn)) fabric.Remote {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ownerKey, ownerID := testhelp.Key(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := peerauth.Server(c, ownerKey, nil); err != nil {
			return
		}
		readRequest(c, new([maxRequest]byte))
		misbehave(c)
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return fabric.Remote{Peer: ownerID.String(), Addrs: map[string]string{fabric.TCP: ln.Addr().String()}, Length: n}
}

// readOnce reads r with a fresh transport into fresh host memory.
func readOnce(t *testing.T, ctx context.Context, cfg Config, r fabric.Remote) error {
	cfg.Identity, _ = testhelp.Key(t)
	tr, err := New(cfg)
	require.NoError(t, err)
	defer tr.Close()
	dst, err := tensor.NewHostMemory(0).Alloc(context.Background(), r.Length)
	require.NoError(t, err)
	defer dst.Release()
	_, err = tr.Read(ctx, r, dst)
	return err
}

func TestCancelMidTransfer(t *testing.T) {
	r := misbehavingOwner(t, 1<<20, func(c net.Conn) {
		c.Write([]byte{peerauth.StatusOK})
		io.Copy(io.Discard, c) // until the reader hangs up
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, readOnce(t, ctx, Config{}, r), context.DeadlineExceeded)
}

func TestStallDetected(t *testing.T) {
	release := make(chan struct{})
	r := misbehavingOwner(t, 4096, func(c net.Conn) {
		c.Write([]byte{peerauth.StatusOK})
		<-release
	})
	defer close(release)
	err := readOnce(t, context.Background(), Config{Security: fabric.Security{StallTimeout: 100 * time.Millisecond}}, r)
	assert.ErrorIs(t, err, fabric.ErrStalled)
}

func TestCorruptChunkDetected(t *testing.T) {
	r := misbehavingOwner(t, 4, func(c net.Conn) {
		// a raw block of 4 bytes whose checksum is of something else
		var hdr [tcodec.HeaderSize]byte
		tcodec.Header{Codec: tcodec.Raw, RawLen: 4, EncLen: 4, Sum: 0x01020304}.Put(hdr[:])
		c.Write(append(append([]byte{peerauth.StatusOK}, hdr[:]...), "data"...))
		io.Copy(io.Discard, c)
	})
	assert.ErrorIs(t, readOnce(t, context.Background(), Config{}, r), fabric.ErrCorrupt)
}

func TestServerRejectsGarbage(t *testing.T) {
	f := newFixture(t, 1024, nil)
	c, err := net.Dial("tcp", f.srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n0123456789012345678901234567890123456789"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(c) // EOF or reset: either way the server hangs up
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the server hangs up instead of waiting")
	assert.Equal(t, int64(0), f.opens.Load())
}

func TestCloseIdempotent(t *testing.T) {
	f := newFixture(t, 1024, nil)
	_, err := f.tr.Read(context.Background(), f.remote(10), f.dst(t, 10))
	require.NoError(t, err)
	require.NoError(t, f.tr.Close())
	require.NoError(t, f.tr.Close())
	require.NoError(t, f.srv.Close())
	require.NoError(t, f.srv.Close())
	_, err = f.tr.Read(context.Background(), f.remote(10), f.dst(t, 10))
	assert.ErrorIs(t, err, fabric.ErrClosed)
}
