package peerauth

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handshake runs both ends over a loopback TCP connection and returns both
// results and the connections.
func handshake(t *testing.T, copts, sopts Options, authorize func(peer.ID) error) (cr, sr Result, cerr, serr error, cc, sc net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	skey, sid := testhelp.Key(t)
	ckey, _ := testhelp.Key(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		sc = c
		sr, serr = ServerWith(c, skey, authorize, sopts)
		if serr != nil {
			c.Close()
		}
	}()
	cc, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	cr, cerr = ClientWith(cc, ckey, sid, copts)
	if cerr != nil {
		cc.Close()
	}
	<-done
	t.Cleanup(func() {
		cc.Close()
		if sc != nil {
			sc.Close()
		}
	})
	return
}

func TestHandshakeOptions(t *testing.T) {
	psk := bytes.Repeat([]byte{7}, 32)
	other := bytes.Repeat([]byte{8}, 32)
	tests := []struct {
		name       string
		client     Options
		server     Options
		ok         bool
		encrypted  bool
		clientSees error
	}{
		{"plain v1", Options{}, Options{}, true, false, nil},
		{"same cluster key", Options{PSK: psk}, Options{PSK: psk}, true, false, nil},
		{"different cluster key", Options{PSK: other}, Options{PSK: psk}, false, false, fabric.ErrUnauthorized},
		{"client without key", Options{}, Options{PSK: psk}, false, false, nil},
		{"client with key, server without", Options{PSK: psk}, Options{}, false, false, fabric.ErrUnauthorized},
		{"encrypted", Options{Encrypt: true}, Options{Encrypt: true}, true, true, nil},
		{"client asks for encryption", Options{Encrypt: true}, Options{}, true, true, nil},
		{"server requires encryption", Options{PSK: psk}, Options{PSK: psk, Encrypt: true}, false, false, fabric.ErrUnauthorized},
		{"key and encryption", Options{PSK: psk, Encrypt: true}, Options{PSK: psk, Encrypt: true}, true, true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cr, sr, cerr, serr, _, _ := handshake(t, tc.client, tc.server, nil)
			if !tc.ok {
				assert.Error(t, cerr)
				assert.Error(t, serr)
				assert.True(t, errors.Is(cerr, fabric.ErrUnauthorized) || errors.Is(serr, fabric.ErrUnauthorized), "refused with a typed error: client %v, server %v", cerr, serr)
				if tc.clientSees != nil {
					assert.ErrorIs(t, cerr, tc.clientSees)
				}
				return
			}
			require.NoError(t, cerr)
			require.NoError(t, serr)
			assert.Equal(t, tc.encrypted, cr.Keys != nil)
			assert.Equal(t, tc.encrypted, sr.Keys != nil)
			if tc.encrypted {
				assert.Equal(t, cr.Keys.Send, sr.Keys.Recv)
				assert.Equal(t, cr.Keys.Recv, sr.Keys.Send)
				assert.NotEqual(t, cr.Keys.Send, cr.Keys.Recv)
			}
		})
	}
}

func TestHandshakeAuthorize(t *testing.T) {
	no := errors.New("not on the list")
	_, _, cerr, serr, _, _ := handshake(t, Options{PSK: make([]byte, 32)}, Options{PSK: make([]byte, 32)}, func(peer.ID) error { return no })
	assert.ErrorIs(t, cerr, fabric.ErrUnauthorized)
	assert.ErrorIs(t, serr, fabric.ErrUnauthorized)
}

func TestSecureRoundTrip(t *testing.T) {
	cr, sr, cerr, serr, cc, sc := handshake(t, Options{Encrypt: true}, Options{Encrypt: true}, nil)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	c, err := cr.Wrap(cc)
	require.NoError(t, err)
	s, err := sr.Wrap(sc)
	require.NoError(t, err)

	for _, n := range []int{1, 100, MaxRecord - 1, MaxRecord, MaxRecord + 1, 3*MaxRecord + 17} {
		want := make([]byte, n)
		rand.Read(want)
		go func() { c.Write(want) }()
		got := make([]byte, n)
		// Small reads exercise the buffered path, the rest the direct one.
		_, err := io.ReadFull(s, got[:min(n, 7)])
		require.NoError(t, err)
		_, err = io.ReadFull(s, got[min(n, 7):])
		require.NoError(t, err)
		require.True(t, bytes.Equal(want, got), "%d bytes", n)
	}
	// The wire does not carry the plaintext.
	raw, rawS := net.Pipe()
	defer raw.Close()
	defer rawS.Close()
	enc, err := Secure(raw, *cr.Keys)
	require.NoError(t, err)
	secret := bytes.Repeat([]byte("weights!"), 64)
	go func() { enc.Write(secret) }()
	onWire := make([]byte, recordHeader+len(secret)+tagLen)
	_, err = io.ReadFull(rawS, onWire)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(onWire, []byte("weights!")))
}

func TestSecureTamper(t *testing.T) {
	k := Keys{Send: bytes.Repeat([]byte{1}, 32), Recv: bytes.Repeat([]byte{2}, 32)}
	peerKeys := Keys{Send: k.Recv, Recv: k.Send}
	record := func() []byte {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		w, _ := Secure(a, k)
		go func() { w.Write([]byte("hello tensor")) }()
		out := make([]byte, recordHeader+12+tagLen)
		io.ReadFull(b, out)
		return out
	}
	read := func(wire []byte) error {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		r, _ := Secure(a, peerKeys)
		go func() { b.Write(wire); b.Close() }()
		_, err := io.ReadAll(r)
		return err
	}
	good := record()
	require.NoError(t, read(good))
	for _, i := range []int{0, 3, 5, len(good) - 1} {
		bad := bytes.Clone(good)
		bad[i] ^= 0x80
		err := read(bad)
		require.Error(t, err, "byte %d flipped", i)
	}
	bad := bytes.Clone(good)
	bad[10] ^= 1
	assert.ErrorIs(t, read(bad), fabric.ErrCorrupt)
	assert.ErrorIs(t, read(append(bytes.Clone(good), good...)), fabric.ErrCorrupt, "a replayed record fails")
	_, err := Secure(a0(), Keys{Send: []byte{1}, Recv: k.Recv})
	assert.Error(t, err)
}

func a0() net.Conn { a, _ := net.Pipe(); a.Close(); return a }

type fuzzRW struct {
	io.Reader
	io.Writer
}

// FuzzServerHandshake feeds arbitrary client bytes to the server side of
// the handshake: it must fail with an error, never panic or hang.
func FuzzServerHandshake(f *testing.F) {
	skey, _ := testhelp.Key(f)
	ckey, _ := testhelp.Key(f)
	// Seed with real client openings of both versions.
	for _, o := range []Options{{}, {PSK: make([]byte, 32)}, {Encrypt: true}} {
		var buf bytes.Buffer
		ClientWith(fuzzRW{bytes.NewReader(nil), &buf}, ckey, "", o)
		f.Add(buf.Bytes(), o.PSK != nil, o.Encrypt)
	}
	f.Fuzz(func(t *testing.T, in []byte, psk, enc bool) {
		o := Options{Encrypt: enc}
		if psk {
			o.PSK = make([]byte, 32)
		}
		_, err := ServerWith(fuzzRW{bytes.NewReader(in), io.Discard}, skey, nil, o)
		if err == nil {
			t.Fatal("random bytes were admitted")
		}
	})
}

// FuzzSecureRead feeds arbitrary bytes to an encrypted reader.
func FuzzSecureRead(f *testing.F) {
	k := Keys{Send: bytes.Repeat([]byte{1}, 32), Recv: bytes.Repeat([]byte{2}, 32)}
	f.Add([]byte{0, 0, 0, 20, 1, 2, 3})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &secureConn{Conn: fakeConn{bytes.NewReader(in)}}
		s, _ := Secure(c.Conn, k)
		if _, err := io.ReadAll(s); err == nil && len(in) > 0 {
			t.Fatal("forged records were accepted")
		}
	})
}

type fakeConn struct{ r io.Reader }

func (f fakeConn) Read(p []byte) (int, error)       { return f.r.Read(p) }
func (f fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (fakeConn) Close() error                       { return nil }
func (fakeConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (fakeConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (fakeConn) SetDeadline(_ time.Time) error      { return nil }
func (fakeConn) SetReadDeadline(_ time.Time) error  { return nil }
func (fakeConn) SetWriteDeadline(_ time.Time) error { return nil }

func TestServerRefusesOtherProtocols(t *testing.T) {
	skey, _ := testhelp.Key(t)
	var out bytes.Buffer
	in := append([]byte("GET / HTTP/1.1\r\n"), make([]byte, 64)...)
	_, err := ServerWith(fuzzRW{bytes.NewReader(in), &out}, skey, nil, Options{})
	assert.ErrorIs(t, err, fabric.ErrBadRequest)
	assert.Equal(t, StatusBadRequest, out.Bytes()[0], "the other end is told why")
}

// Every condition the owner reports must reach the reader as the same
// fabric sentinel: an owner whose transport closed mid-request is shutting
// down, not failing internally (seen as an untyped error in the rdma
// conformance run before StatusFor knew fabric.ErrClosed).
func TestStatusRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		owner error
		want  error
	}{
		{fabric.ErrObjectNotFound, fabric.ErrObjectNotFound},
		{fabric.ErrObjectFreed, fabric.ErrObjectFreed},
		{fabric.ErrStaleRef, fabric.ErrStaleRef},
		{fabric.ErrUnauthorized, fabric.ErrUnauthorized},
		{fabric.ErrBadRequest, fabric.ErrBadRequest},
		{fabric.ErrOwnerClosed, fabric.ErrOwnerClosed},
		{fmt.Errorf("rdma: register on nic0: %w", fabric.ErrClosed), fabric.ErrOwnerClosed},
		{fmt.Errorf("%w: generation 3 not done yet", fabric.ErrSinkBusy), fabric.ErrSinkBusy},
	} {
		got := StatusError(StatusFor(tc.owner), tc.owner.Error())
		assert.ErrorIs(t, got, tc.want, "owner said %v", tc.owner)
	}
	internal := StatusError(StatusFor(errors.New("disk on fire")), "disk on fire")
	assert.NotErrorIs(t, internal, fabric.ErrOwnerClosed)
}
