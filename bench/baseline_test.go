package bench

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>9)
	}
	return p
}

// Both serialize baselines deliver exactly the bytes asked for, across
// chunk boundaries, and can be asked again.
func TestSerializeBaselinesRoundTrip(t *testing.T) {
	src := pattern(2*ObjectChunk + 4099)
	pair, err := NewSerializePair(src)
	require.NoError(t, err)
	defer pair.Close()
	host := NewSerializer(src)
	for _, n := range []int{0, 1, 4096, ObjectChunk - 1, ObjectChunk, ObjectChunk + 1, len(src)} {
		for name, read := range map[string]func([]byte) error{
			"socket": func(d []byte) error { _, err := pair.Read(d); return err },
			"host":   func(d []byte) error { _, err := host.Read(d); return err },
		} {
			dst := make([]byte, n)
			require.NoError(t, read(dst), "%s %d", name, n)
			assert.True(t, bytes.Equal(src[:n], dst), "%s %d bytes differ", name, n)
		}
	}
	require.NoError(t, pair.Close())
	require.NoError(t, pair.Close(), "Close is idempotent")
	_, err = pair.Read(make([]byte, 8))
	assert.Error(t, err, "a closed pair says so instead of hanging")
	_, err = host.Read(make([]byte, len(src)+1))
	assert.Error(t, err)
}

func TestApplyChunkRejectsBadMessages(t *testing.T) {
	good := appendChunk(nil, 4, 16, []byte("abcd"))[frameHeader:]
	field := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	data := protowire.AppendBytes(protowire.AppendTag(nil, fieldData, protowire.BytesType), []byte("abcd"))
	tests := []struct {
		name string
		body []byte
		ok   bool
	}{
		{"good", good, true},
		{"unknown fields are skipped", append(field(9, 1), good...), true},
		{"empty", nil, false},
		{"truncated", good[:len(good)-1], false},
		{"no data", append(field(fieldOffset, 0), field(fieldTotal, 16)...), false},
		{"other total", append(append(field(fieldOffset, 0), field(fieldTotal, 17)...), data...), false},
		{"past the end", append(append(field(fieldOffset, 13), field(fieldTotal, 16)...), data...), false},
		{"huge offset", append(append(field(fieldOffset, 1<<63), field(fieldTotal, 16)...), data...), false},
		{"bad tag", []byte{0}, false},
	}
	for _, tc := range tests {
		dst := make([]byte, 16)
		n, err := applyChunk(dst, tc.body)
		if tc.ok {
			require.NoError(t, err, tc.name)
			assert.Equal(t, 4, n)
			assert.Equal(t, []byte("abcd"), dst[4:8])
			continue
		}
		assert.ErrorIs(t, err, ErrBadMessage, tc.name)
	}
}

func FuzzApplyChunk(f *testing.F) {
	f.Add(appendChunk(nil, 0, 64, pattern(64))[frameHeader:])
	f.Add(appendChunk(nil, 60, 64, pattern(4))[frameHeader:])
	f.Add([]byte{0x10, 0xff})
	f.Fuzz(func(t *testing.T, body []byte) {
		dst := make([]byte, 64)
		n, err := applyChunk(dst, body)
		if err == nil && (n < 0 || n > len(dst)) {
			t.Fatalf("placed %d bytes into %d", n, len(dst))
		}
	})
}

func TestTCPPairClosed(t *testing.T) {
	src := pattern(1 << 20)
	p, err := NewTCPPair(src)
	require.NoError(t, err)
	dst := make([]byte, len(src))
	_, err = p.Read(dst)
	require.NoError(t, err)
	assert.Equal(t, src, dst)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	_, err = p.Read(dst)
	assert.Error(t, err, "a closed pair says so instead of panicking or hanging")
}
