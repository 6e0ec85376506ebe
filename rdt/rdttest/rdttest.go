// Package rdttest holds test helpers that need the rdt API: forging a
// serialized Ref to check that owners refuse it. Helpers that need only
// tensor or libp2p live in internal/testhelp, so rdt's own internal tests
// (which cannot import this package: rdttest imports rdt) use those.
package rdttest

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
)

// Forge decodes a base64 Ref (as the worker protocol carries it), lets f
// change it and encodes it again. The token is copied first, so f may
// change it in place without touching the original's.
func Forge(t testing.TB, ref string, f func(*rdt.Ref)) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(ref)
	require.NoError(t, err)
	r, err := rdt.ParseRef(b)
	require.NoError(t, err)
	r.Token = append([]byte(nil), r.Token...)
	f(&r)
	b, err = r.MarshalBinary()
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(b)
}
