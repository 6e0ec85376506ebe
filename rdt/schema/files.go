package schema

import (
	"encoding/hex"
	"errors"
	"os"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// LoadIdentity reads the libp2p private key of identity_file, or creates
// and stores one (mode 0600), so a restarted runtime keeps its peer ID. An
// empty path returns nil (a new identity each start).
func LoadIdentity(path string) (crypto.PrivKey, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := crypto.UnmarshalPrivateKey(b)
		if err != nil {
			return nil, Bad("identity_file", "%s: %v", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return nil, err
	}
	b, err = crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// LoadClusterKey reads the 32-byte key of cluster_key_file, raw or as 64
// hex digits. An empty path returns nil.
func LoadClusterKey(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &FieldError{Field: "cluster_key_file", Err: err}
	}
	if len(b) == 32 {
		return b, nil
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != 32 {
		return nil, Bad("cluster_key_file", "%s: want 32 bytes, raw or as 64 hex digits", path)
	}
	return k, nil
}
