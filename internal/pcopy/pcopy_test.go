package pcopy

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCopySizes(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 1 << 20, 8<<20 + 3, 33<<20 + 4097} {
		for _, w := range []int{1, 2, 3, 8} {
			t.Run(fmt.Sprintf("%d/w%d", n, w), func(t *testing.T) {
				from := make([]byte, n)
				rand.Read(from)
				to := make([]byte, n+5)
				require.NoError(t, Copy(context.Background(), to, from, Options{Workers: w, MinParallel: 1 << 20, Chunk: 256 << 10}))
				assert.True(t, bytes.Equal(to[:n], from))
			})
		}
	}
}

func TestCopyStops(t *testing.T) {
	from := make([]byte, 16<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, Copy(ctx, make([]byte, len(from)), from, Options{Workers: 2}), context.Canceled)
	boom := errors.New("peer gone")
	assert.ErrorIs(t, Copy(context.Background(), make([]byte, len(from)), from, Options{Workers: 2, Check: func() error { return boom }}), boom)
	assert.Error(t, Copy(context.Background(), make([]byte, 1), from, Options{}))
}

// A shared file that shrinks under its mapping faults every worker; each
// fault becomes a FaultError, not a crash.
func TestCopyFault(t *testing.T) {
	fd, err := unix.MemfdCreate("pcopy-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(fd)
	const n = 16 << 20
	require.NoError(t, unix.Ftruncate(fd, n))
	data, err := unix.Mmap(fd, 0, n, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(data)
	require.NoError(t, unix.Ftruncate(fd, 0))
	var fe *FaultError
	err = Copy(context.Background(), make([]byte, n), data, Options{Workers: 4, GuardFaults: true})
	require.ErrorAs(t, err, &fe)
}

// BenchmarkCopy compares one worker with several on 256 MiB (a ratio on
// one machine, in one run: go test -bench Copy ./internal/pcopy/).
func BenchmarkCopy(b *testing.B) {
	const n = 256 << 20
	from, to := make([]byte, n), make([]byte, n)
	rand.Read(from[:1<<20])
	copy(to, from) // touch every page first
	for _, w := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				if err := Copy(context.Background(), to, from, Options{Workers: w}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
