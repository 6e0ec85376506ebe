package multihost

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// 5b. with a cluster key, a process on the same network without it (or
// with another key) can neither open the control channel nor read an
// object, even holding a real ref; members still can.
func TestRogueWithoutClusterKey(t *testing.T) {
	dir := t.TempDir()
	writeKey := func(name string) string {
		k := make([]byte, 32)
		rand.Read(k)
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(hex.EncodeToString(k)), 0o600))
		return p
	}
	c := New(t, Options{Args: []string{"--cluster-key-file", writeKey("cluster.key")}})
	ctx := testCtx(t, 2*time.Minute)
	owner, member := c.Hosts[0], c.Hosts[1]
	ref := put(t, ctx, owner.W, 1<<20, 11)
	r := get(t, ctx, member.W, ref, 11)
	require.True(t, r.OK && r.Verified, "a member with the key: %s", r.Error)

	rogues := []struct {
		name, label, ip string
		args            []string
	}{
		{"no key", "roguea", "10.77.0.91", nil},
		{"another key", "rogueb", "10.77.0.92", []string{"--cluster-key-file", writeKey("other.key")}},
	}
	for _, rg := range rogues {
		t.Run(rg.name, func(t *testing.T) {
			rogue := c.AddHost(ctx, rg.label, "h2", rg.ip, false, rg.args...)
			start := time.Now()
			r, err := rogue.W.Call(ctx, Request{Op: "connect", Peer: owner.W.Ready.Peer, Addrs: owner.W.Ready.Addrs, TimeoutMS: 20_000})
			require.NoError(t, err)
			require.False(t, r.OK, "a process without the cluster key opened the control channel")
			// A private network cannot answer a non-member in words it
			// understands, so the refusal may also surface as a dial timeout.
			assert.Contains(t, []string{"peer_unreachable", "unauthorized", "timeout"}, r.Code, r.Error)
			record(t, "5b rogue ("+rg.name+") connect refused", time.Since(start), r.Code)

			start = time.Now()
			r = get(t, ctx, rogue.W, ref, 11) // a real ref, stolen
			require.False(t, r.OK, "a process without the cluster key read an object")
			// The control channel refuses it before the data path is tried.
			assert.Contains(t, []string{"unauthorized", "peer_unreachable"}, r.Code, r.Error)
			record(t, "5b rogue ("+rg.name+") get with a stolen ref", time.Since(start), r.Code)
			assert.Zero(t, info(t, ctx, rogue.W).Used, "the rogue's memory is back to baseline")
		})
	}
	free(t, ctx, owner.W, ref)
	backToBaseline(t, ctx, owner.W, 0, 5*time.Second)
	backToBaseline(t, ctx, member.W, 0, 5*time.Second)
}

// 5c. encrypted data connections carry verified bytes between hosts; an
// owner that encrypts refuses a reader that does not; an owner with an
// allowlist serves only the peers on it.
func TestEncryptionAndAllowlist(t *testing.T) {
	c := New(t, Options{Args: []string{"--encrypt-data"}})
	ctx := testCtx(t, 2*time.Minute)
	owner, reader, other := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	ref := put(t, ctx, owner.W, 16<<20, 13)
	r := get(t, ctx, reader.W, ref, 13)
	require.True(t, r.OK && r.Verified, "encrypted transfer: %s %s", r.Code, r.Error)
	t.Logf("encrypted 16 MiB over the namespace link: %.0f MB/s", float64(r.Bytes)/r.Seconds/1e6)

	plain := c.AddHost(ctx, "plain", "h2", "10.77.0.60", false) // no --encrypt-data
	c.Connect(ctx, plain, owner)
	start := time.Now()
	r = get(t, ctx, plain.W, ref, 13)
	require.False(t, r.OK, "an encrypting owner served a reader in the clear")
	assert.Equal(t, "unauthorized", r.Code, r.Error)
	record(t, "5c unencrypted reader refused by an encrypting owner", time.Since(start), r.Code)
	free(t, ctx, owner.W, ref)

	// Only the reader may connect to the owner now.
	owner.SetArgs("--allow-peers", reader.W.Ready.Peer)
	owner.Restart(ctx)
	c.Connect(ctx, reader, owner)
	ref = put(t, ctx, owner.W, 1<<20, 14)
	r = get(t, ctx, reader.W, ref, 14)
	assert.True(t, r.OK && r.Verified, "allowed reader: %s %s", r.Code, r.Error)
	start = time.Now()
	r = get(t, ctx, other.W, ref, 14)
	require.False(t, r.OK, "a peer not on the allowlist read an object")
	assert.Contains(t, []string{"unauthorized", "peer_unreachable"}, r.Code, r.Error)
	record(t, "5c peer not on the allowlist refused", time.Since(start), r.Code)
	free(t, ctx, owner.W, ref)
	backToBaseline(t, ctx, owner.W, 0, 5*time.Second)
	for _, w := range []*Worker{reader.W, other.W, plain.W} {
		backToBaseline(t, ctx, w, 0, 5*time.Second)
	}
}
