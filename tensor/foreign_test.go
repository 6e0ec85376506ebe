package tensor

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestForeignInPlaceAndStagedOnce(t *testing.T) {
	host := NewHostMemory(0)
	defer host.Close()
	data := []byte("caller-owned bytes, not tensorlane's")
	released := 0
	f := NewForeign(data, ForeignConfig{Stage: host, OnRelease: func() { released++ }})

	// Network paths see the caller's memory itself: no copy.
	p, err := BytesOf(f)
	require.NoError(t, err)
	assert.Same(t, &data[0], &p[0])
	assert.False(t, f.Staged())
	assert.Equal(t, HostDevice, f.Device())

	// Another process on the host gets one copy, made on the first Export.
	h1, err := f.Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h1.FD)
	assert.True(t, f.Staged())
	assert.Equal(t, 1, host.Stats().Allocs)
	h2, err := f.Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h2.FD)
	assert.Equal(t, 1, host.Stats().Allocs, "the second Export reuses the copy")
	m, err := unix.Mmap(h1.FD, 0, int(h1.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	assert.Equal(t, data, m[h1.Offset:h1.Offset+h1.Length])
	unix.Munmap(m)

	_, err = f.Export(Writable)
	assert.ErrorIs(t, err, ErrExportAccess, "a copy cannot take writes for the caller")

	require.NoError(t, f.Release())
	require.NoError(t, f.Release())
	assert.Equal(t, 1, released, "OnRelease runs once")
	assert.Equal(t, 0, host.Stats().Allocs, "the staged copy went back")
	assert.Nil(t, f.Bytes())
	_, err = f.Export(ReadOnly)
	assert.ErrorIs(t, err, ErrReleased)
}

// Stage makes the copy ahead of the first Export (the C ABI does it in the
// background at Put), and the Export then reuses it.
func TestForeignStageAhead(t *testing.T) {
	host := NewHostMemory(0)
	defer host.Close()
	data := []byte("staged before any reader asked")
	f := NewForeign(data, ForeignConfig{Stage: host})
	require.NoError(t, f.Stage())
	require.NoError(t, f.Stage(), "idempotent")
	assert.True(t, f.Staged())
	assert.Equal(t, 1, host.Stats().Allocs)
	h, err := f.Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	assert.Equal(t, 1, host.Stats().Allocs, "the Export reuses the early copy")
	require.NoError(t, f.Release())
	assert.ErrorIs(t, f.Stage(), ErrReleased)
	assert.ErrorIs(t, NewForeign(data, ForeignConfig{}).Stage(), ErrNotExportable)
}

func TestForeignExportErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *Foreign
	}{
		{"no staging memory", NewForeign([]byte{1, 2, 3}, ForeignConfig{})},
		{"empty", NewForeign(nil, ForeignConfig{Stage: NewHostMemory(0)})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.f.Export(ReadOnly)
			assert.ErrorIs(t, err, ErrNotExportable)
		})
	}
	full := NewHostMemory(2)
	_, err := NewForeign([]byte{1, 2, 3}, ForeignConfig{Stage: full}).Export(ReadOnly)
	assert.ErrorIs(t, err, ErrOutOfMemory)
}

func TestSharedWindows(t *testing.T) {
	host := NewHostMemory(0)
	defer host.Close()
	buf, err := host.Alloc(context.Background(), 4096)
	require.NoError(t, err)
	all, _ := BytesOf(buf)
	for i := range all {
		all[i] = byte(i)
	}
	s := NewShared(buf)
	w, err := s.Window(100, 50)
	require.NoError(t, err)
	p, err := BytesOf(w)
	require.NoError(t, err)
	assert.Equal(t, all[100:150], p)
	h, err := ExportOf(w, ReadOnly)
	require.NoError(t, err)
	unix.Close(h.FD)
	assert.Equal(t, int64(100), h.Offset)
	assert.Equal(t, int64(50), h.Length)

	_, err = s.Window(4000, 200)
	assert.True(t, errors.Is(err, ErrBadDesc))

	// The creator lets go first: the window keeps the memory.
	require.NoError(t, s.Release())
	assert.Equal(t, 1, host.Stats().Allocs)
	require.NoError(t, w.Release())
	require.NoError(t, w.Release())
	assert.Equal(t, 0, host.Stats().Allocs)
	_, err = s.Window(0, 1)
	assert.ErrorIs(t, err, ErrReleased)
}
