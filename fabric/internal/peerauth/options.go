package peerauth

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
)

// Options turn on cluster membership and encryption for a data connection.
// The zero value authenticates identities only.
type Options struct {
	// PSK is the cluster's pre-shared key (the libp2p private-network key).
	// When set, both ends prove they hold it with an HMAC over the signed
	// transcript, so a peer outside the cluster can open neither the control
	// channel nor a data connection. A server with a PSK refuses clients
	// without one.
	PSK []byte
	// Encrypt asks for (client) or requires (server) an encrypted
	// connection: both ends contribute an ephemeral X25519 key inside the
	// signed transcript and derive AES-256-GCM session keys with HKDF.
	// A server without Encrypt still accepts a client that asks for it.
	Encrypt bool
}

// Result is what a handshake established.
type Result struct {
	Peer peer.ID
	// Keys are the session keys when the connection is encrypted; nil
	// otherwise.
	Keys *Keys
}

// Keys are one end's AEAD keys for an encrypted connection.
type Keys struct {
	Send, Recv []byte // 32 bytes each (AES-256)
}

// The handshake (v2; v1, without options, is no longer spoken):
//
//	client -> server: magic "TLD2" | client nonce (32) | flags (1) | client public key | [client X25519 (32)]
//	server -> client: status (0 = go on) [| message, then close]
//	server -> client: server nonce (32) | server public key | [server X25519 (32)] | sig_s | [mac_s (32)]
//	client -> server: sig_c | [mac_c (32)]
//	server -> client: status (0 = admitted) [| message]
//
// sig_x signs transcript2(x), which covers the flags, both nonces, the other
// side's identity key and both ephemeral keys, so the ephemeral keys are
// bound to the identities; mac_x is HMAC-SHA256 of the same transcript under
// a key derived from the PSK.
const (
	magic2   = "TLD2"
	flagPSK  = 1 << 0
	flagEnc  = 1 << 1
	x25519Sz = 32
	macLen   = sha256.Size
)

func transcript2(role string, flags byte, cn, sn, key, ec, es []byte) []byte {
	out := []byte("tensorlane/data/v2 " + role)
	out = append(out, flags)
	out = append(out, cn...)
	out = append(out, sn...)
	out = append(out, key...)
	out = append(out, ec...)
	return append(out, es...)
}

func pskMAC(psk, transcript []byte) []byte {
	k, err := hkdf.Key(sha256.New, psk, nil, "tensorlane/data/v2 psk mac", 32)
	if err != nil {
		panic(err) // only for lengths sha256 cannot produce
	}
	m := hmac.New(sha256.New, k)
	m.Write(transcript)
	return m.Sum(nil)
}

// sessionKeys derives both directions' keys; the PSK, when set, is mixed in
// so a leaked identity key alone does not open recorded traffic.
func sessionKeys(priv *ecdh.PrivateKey, theirs, psk, cn, sn []byte, client bool) (*Keys, error) {
	pub, err := ecdh.X25519().NewPublicKey(theirs)
	if err != nil {
		return nil, fmt.Errorf("%w: bad ephemeral key: %v", fabric.ErrUnauthorized, err)
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: key agreement: %v", fabric.ErrUnauthorized, err)
	}
	salt := append(append([]byte{}, cn...), sn...)
	km, err := hkdf.Key(sha256.New, append(shared, psk...), salt, "tensorlane/data/v2 session keys", 64)
	if err != nil {
		return nil, err
	}
	c2s, s2c := km[:32], km[32:]
	if client {
		return &Keys{Send: c2s, Recv: s2c}, nil
	}
	return &Keys{Send: s2c, Recv: c2s}, nil
}

// ClientWith is Client with options; it returns the server's identity and,
// when encrypting, the session keys to pass to Secure.
func ClientWith(rw io.ReadWriter, key crypto.PrivKey, want peer.ID, opts Options) (Result, error) {
	cn := make([]byte, nonceLen)
	rand.Read(cn)
	ourKey, err := crypto.MarshalPublicKey(key.GetPublic())
	if err != nil {
		return Result{}, err
	}
	var flags byte
	var eph *ecdh.PrivateKey
	var ec []byte
	if len(opts.PSK) > 0 {
		flags |= flagPSK
	}
	if opts.Encrypt {
		flags |= flagEnc
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return Result{}, err
		}
		ec = eph.PublicKey().Bytes()
	}
	hello := append([]byte(magic2), cn...)
	hello = append(hello, flags)
	if _, err := rw.Write(hello); err != nil {
		return Result{}, err
	}
	if err := WriteField(rw, ourKey); err != nil {
		return Result{}, err
	}
	if _, err := rw.Write(ec); err != nil {
		return Result{}, err
	}
	if err := readStatus(rw); err != nil {
		return Result{}, err
	}
	sn := make([]byte, nonceLen)
	if _, err := io.ReadFull(rw, sn); err != nil {
		return Result{}, err
	}
	theirKey, err := ReadField(rw, maxKeyLen)
	if err != nil {
		return Result{}, err
	}
	var es []byte
	if eph != nil {
		es = make([]byte, x25519Sz)
		if _, err := io.ReadFull(rw, es); err != nil {
			return Result{}, err
		}
	}
	sig, err := ReadField(rw, maxSigLen)
	if err != nil {
		return Result{}, err
	}
	var mac []byte
	if len(opts.PSK) > 0 {
		mac = make([]byte, macLen)
		if _, err := io.ReadFull(rw, mac); err != nil {
			return Result{}, err
		}
	}
	pub, id, err := publicKeyOf(theirKey)
	if err != nil {
		return Result{}, err
	}
	if want != "" && id != want {
		return Result{}, fmt.Errorf("%w: data server is %s, the reference names %s", fabric.ErrUnauthorized, id, want)
	}
	st := transcript2("server", flags, cn, sn, ourKey, ec, es)
	if ok, err := pub.Verify(st, sig); err != nil || !ok {
		return Result{}, fmt.Errorf("%w: server signature does not verify", fabric.ErrUnauthorized)
	}
	if len(opts.PSK) > 0 && !hmac.Equal(mac, pskMAC(opts.PSK, st)) {
		return Result{}, fmt.Errorf("%w: server does not hold the cluster key", fabric.ErrUnauthorized)
	}
	ct := transcript2("client", flags, cn, sn, theirKey, ec, es)
	ourSig, err := key.Sign(ct)
	if err != nil {
		return Result{}, err
	}
	msg := appendField(nil, ourSig)
	if len(opts.PSK) > 0 {
		msg = append(msg, pskMAC(opts.PSK, ct)...)
	}
	if _, err := rw.Write(msg); err != nil {
		return Result{}, err
	}
	if err := readStatus(rw); err != nil {
		return Result{}, err
	}
	res := Result{Peer: id}
	if eph != nil {
		if res.Keys, err = sessionKeys(eph, es, opts.PSK, cn, sn, true); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

func appendField(b, p []byte) []byte {
	b = append(b, byte(len(p)>>8), byte(len(p)))
	return append(b, p...)
}

func readStatus(r io.Reader) error {
	var status [1]byte
	if _, err := io.ReadFull(r, status[:]); err != nil {
		return err
	}
	if status[0] != StatusOK {
		msg, _ := ReadField(r, MaxMessage)
		return StatusError(status[0], string(msg))
	}
	return nil
}

// ServerWith is Server with options. A server with a PSK or Encrypt refuses
// clients that do not meet them, with StatusUnauthorized.
func ServerWith(rw io.ReadWriter, key crypto.PrivKey, authorize func(peer.ID) error, opts Options) (Result, error) {
	hello := make([]byte, len(magic2)+nonceLen)
	if _, err := io.ReadFull(rw, hello); err != nil {
		return Result{}, err
	}
	cn := hello[len(magic2):]
	if string(hello[:len(magic2)]) != magic2 {
		WriteStatus(rw, StatusBadRequest, "not a tensorlane data handshake (v2)")
		return Result{}, fmt.Errorf("%w: not a tensorlane data connection", fabric.ErrBadRequest)
	}
	var fl [1]byte
	if _, err := io.ReadFull(rw, fl[:]); err != nil {
		return Result{}, err
	}
	flags := fl[0]
	theirKey, err := ReadField(rw, maxKeyLen)
	if err != nil {
		return Result{}, err
	}
	var ec []byte
	if flags&flagEnc != 0 {
		ec = make([]byte, x25519Sz)
		if _, err := io.ReadFull(rw, ec); err != nil {
			return Result{}, err
		}
	}
	refuse := func(msg string) (Result, error) {
		WriteStatus(rw, StatusUnauthorized, msg)
		return Result{}, fmt.Errorf("%w: %s", fabric.ErrUnauthorized, msg)
	}
	switch {
	case flags&^(flagPSK|flagEnc) != 0:
		WriteStatus(rw, StatusBadRequest, "unknown handshake flags")
		return Result{}, fmt.Errorf("%w: handshake flags %#x", fabric.ErrBadRequest, flags)
	case len(opts.PSK) > 0 && flags&flagPSK == 0:
		return refuse("cluster key required")
	case len(opts.PSK) == 0 && flags&flagPSK != 0:
		return refuse("this server has no cluster key")
	case opts.Encrypt && flags&flagEnc == 0:
		return refuse("encryption required")
	}
	pub, id, err := publicKeyOf(theirKey)
	if err != nil {
		WriteStatus(rw, StatusUnauthorized, "bad public key")
		return Result{}, err
	}
	if _, err := rw.Write([]byte{StatusOK}); err != nil {
		return Result{}, err
	}
	sn := make([]byte, nonceLen)
	rand.Read(sn)
	ourKey, err := crypto.MarshalPublicKey(key.GetPublic())
	if err != nil {
		return Result{}, err
	}
	var eph *ecdh.PrivateKey
	var es []byte
	if ec != nil {
		if eph, err = ecdh.X25519().GenerateKey(rand.Reader); err != nil {
			return Result{}, err
		}
		es = eph.PublicKey().Bytes()
	}
	st := transcript2("server", flags, cn, sn, theirKey, ec, es)
	sig, err := key.Sign(st)
	if err != nil {
		return Result{}, err
	}
	var out bytes.Buffer
	out.Write(sn)
	out.Write(appendField(nil, ourKey))
	out.Write(es)
	out.Write(appendField(nil, sig))
	if len(opts.PSK) > 0 {
		out.Write(pskMAC(opts.PSK, st))
	}
	if _, err := rw.Write(out.Bytes()); err != nil {
		return Result{}, err
	}
	theirSig, err := ReadField(rw, maxSigLen)
	if err != nil {
		return Result{}, err
	}
	var mac []byte
	if len(opts.PSK) > 0 {
		mac = make([]byte, macLen)
		if _, err := io.ReadFull(rw, mac); err != nil {
			return Result{}, err
		}
	}
	ct := transcript2("client", flags, cn, sn, ourKey, ec, es)
	if ok, err := pub.Verify(ct, theirSig); err != nil || !ok {
		return refuse("client signature does not verify")
	}
	if len(opts.PSK) > 0 && !hmac.Equal(mac, pskMAC(opts.PSK, ct)) {
		return refuse("client does not hold the cluster key")
	}
	if authorize != nil {
		if err := authorize(id); err != nil {
			WriteStatus(rw, StatusUnauthorized, "peer not admitted")
			return Result{}, fmt.Errorf("%w: %v", fabric.ErrUnauthorized, err)
		}
	}
	res := Result{Peer: id}
	if eph != nil {
		if res.Keys, err = sessionKeys(eph, ec, opts.PSK, cn, sn, false); err != nil {
			WriteStatus(rw, StatusUnauthorized, "bad ephemeral key")
			return Result{}, err
		}
	}
	_, err = rw.Write([]byte{StatusOK})
	return res, err
}

var errShortKey = errors.New("peerauth: session keys must be 32 bytes")

// OptionsOf packs a transport's security block into handshake options:
// its cluster key, and encryption when asked for.
func OptionsOf(s fabric.Security) Options { return Options{PSK: s.ClusterKey, Encrypt: s.EncryptData} }

// ClientFor runs the client handshake as s says: s.Identity proves this
// end, the owner must be want, s.PSK and s.Encrypt as in Options.
func ClientFor(rw io.ReadWriter, s fabric.Security, want peer.ID) (Result, error) {
	return ClientWith(rw, s.Identity, want, OptionsOf(s))
}

// ServerFor runs the server handshake as s says, admitting the peers
// s.Authorize admits (all authenticated ones when nil).
func ServerFor(rw io.ReadWriter, s fabric.Security) (Result, error) {
	return ServerWith(rw, s.Identity, s.AllowPeer, OptionsOf(s))
}
