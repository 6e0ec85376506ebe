package tensor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestDTypes(t *testing.T) {
	tests := []struct {
		dt         DType
		name       string
		size       int64
		code, bits uint8
		isFloat    bool
	}{
		{Bool, "bool", 1, DLBool, 8, false},
		{Int8, "int8", 1, DLInt, 8, false},
		{Int16, "int16", 2, DLInt, 16, false},
		{Int32, "int32", 4, DLInt, 32, false},
		{Int64, "int64", 8, DLInt, 64, false},
		{Uint8, "uint8", 1, DLUInt, 8, false},
		{Float16, "float16", 2, DLFloat, 16, true},
		{BFloat16, "bfloat16", 2, DLBfloat, 16, true},
		{Float32, "float32", 4, DLFloat, 32, true},
		{Float64, "float64", 8, DLFloat, 64, true},
		{Float8E4M3, "float8_e4m3fn", 1, DLFloat8E4M3FN, 8, true},
		{Float8E5M2, "float8_e5m2", 1, DLFloat8E5M2, 8, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.name, tc.dt.String())
			assert.Equal(t, tc.size, tc.dt.Size())
			assert.Equal(t, tc.isFloat, tc.dt.IsFloat())
			code, bits, lanes := tc.dt.DLPack()
			assert.Equal(t, tc.code, code)
			assert.Equal(t, tc.bits, bits)
			back, err := FromDLPack(code, bits, lanes)
			require.NoError(t, err)
			assert.Equal(t, tc.dt, back)
			parsed, err := ParseDType(tc.name)
			require.NoError(t, err)
			assert.Equal(t, tc.dt, parsed)
		})
	}
	_, err := FromDLPack(DLFloat, 24, 1)
	assert.Error(t, err)
	_, err = ParseDType("complex128")
	assert.Error(t, err)
	assert.False(t, Invalid.Valid())
	assert.Equal(t, int64(0), DType(200).Size())
}

func TestDescLayout(t *testing.T) {
	d := NewDesc(Float32, 4, 6)
	require.NoError(t, d.Validate())
	assert.True(t, d.Contiguous())
	assert.Equal(t, int64(96), d.NBytes())
	s, e := d.Span()
	assert.Equal(t, [2]int64{0, 96}, [2]int64{s, e})

	rows, err := d.Slice(0, 1, 3) // rows 1..2: still contiguous
	require.NoError(t, err)
	assert.True(t, rows.Contiguous())
	s, e = rows.Span()
	assert.Equal(t, [2]int64{24, 72}, [2]int64{s, e})

	cols, err := d.Slice(1, 2, 4) // columns 2..3 of every row: strided
	require.NoError(t, err)
	assert.False(t, cols.Contiguous())
	s, e = cols.Span()
	assert.Equal(t, [2]int64{8, 88}, [2]int64{s, e}, "first elem (0,2), last elem (3,3)")
	r := cols.Rebased()
	assert.Equal(t, int64(0), r.Offset)
	s, e = r.Span()
	assert.Equal(t, [2]int64{0, 80}, [2]int64{s, e})

	empty := NewDesc(BFloat16, 0, 8)
	s, e = empty.Span()
	assert.Equal(t, s, e)
	assert.Equal(t, int64(0), empty.NBytes())
}

func TestDescValidate(t *testing.T) {
	bad := []Desc{
		{DType: Invalid, Shape: []int64{1}},
		{DType: Float32, Shape: []int64{-1}},
		{DType: Float32, Shape: []int64{2, 2}, Strides: []int64{1}},
		{DType: Float32, Shape: []int64{2}, Strides: []int64{-1}},
		{DType: Float32, Shape: []int64{2}, Offset: -4},
		{DType: Float32, Shape: make([]int64, MaxDims+1)},
		{DType: Float64, Shape: []int64{1 << 40, 1 << 40}},
		{DType: Float64, Shape: []int64{2}, Strides: []int64{1 << 62}},
	}
	for i, d := range bad {
		err := d.Validate()
		assert.ErrorIs(t, err, ErrBadDesc, "case %d: %v", i, d)
	}
	_, err := NewDesc(Float32, 3).Slice(0, 2, 5)
	assert.ErrorIs(t, err, ErrBadDesc)
	_, err = NewDesc(Float32, 3).Slice(1, 0, 1)
	assert.ErrorIs(t, err, ErrBadDesc)
}

func TestParseDeviceID(t *testing.T) {
	for in, want := range map[string]DeviceID{"gpu:3": GPUDevice(3), "cpu": HostDevice, "cpu:0": HostDevice, "tpu:1": {TPU, 1}} {
		got, err := ParseDeviceID(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got)
	}
	for _, in := range []string{"", "gpu:x", "fpga:1", "gpu:-1"} {
		_, err := ParseDeviceID(in)
		assert.Error(t, err, in)
	}
	assert.Equal(t, "gpu:7", GPUDevice(7).String())
}

func TestSimMemoryAllocFreeOOM(t *testing.T) {
	ctx := context.Background()
	const capacity = 1 << 20
	m, err := NewSimMemory(GPUDevice(0), capacity)
	require.NoError(t, err)
	defer m.Close()

	a, err := m.Alloc(ctx, 300<<10)
	require.NoError(t, err)
	b, err := m.Alloc(ctx, 300<<10)
	require.NoError(t, err)
	c, err := m.Alloc(ctx, 300<<10)
	require.NoError(t, err)

	_, err = m.Alloc(ctx, 300<<10)
	require.ErrorIs(t, err, ErrOutOfMemory)
	var oom *OutOfMemoryError
	require.True(t, errors.As(err, &oom))
	assert.Equal(t, int64(300<<10), oom.Requested)
	assert.Equal(t, int64(capacity-900<<10), oom.Free)
	assert.Equal(t, GPUDevice(0), oom.Device)

	// Free the middle block: a fragmented arena still refuses a block larger
	// than its largest hole.
	require.NoError(t, b.Release())
	require.NoError(t, b.Release(), "Release is idempotent")
	_, err = m.Alloc(ctx, 400<<10)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.NoError(t, a.Release())
	d, err := m.Alloc(ctx, 600<<10) // a and b merged
	require.NoError(t, err)
	require.NoError(t, d.Release())
	require.NoError(t, c.Release())

	st := m.Stats()
	assert.Equal(t, int64(0), st.Used)
	assert.Equal(t, int64(capacity), st.LargestFree, "every block merged back")
	assert.Equal(t, 0, st.Allocs)
	assert.True(t, st.Simulated)
}

func TestSimMemoryRandomizedBackToBaseline(t *testing.T) {
	ctx := context.Background()
	m, err := NewSimMemory(GPUDevice(1), 8<<20)
	require.NoError(t, err)
	defer m.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	var live []Buffer
	for i := 0; i < 2000; i++ {
		if len(live) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(live))
			require.NoError(t, live[j].Release())
			live = append(live[:j], live[j+1:]...)
			continue
		}
		b, err := m.Alloc(ctx, rng.Int64N(256<<10))
		if errors.Is(err, ErrOutOfMemory) {
			continue
		}
		require.NoError(t, err)
		p, err := BytesOf(b)
		require.NoError(t, err)
		require.Len(t, p, int(b.Len()))
		live = append(live, b)
	}
	for _, b := range live {
		require.NoError(t, b.Release())
	}
	st := m.Stats()
	assert.Equal(t, int64(0), st.Used)
	assert.Equal(t, st.Capacity, st.LargestFree)
}

func TestSimMemorySparseLargeDevice(t *testing.T) {
	// An 80 GB device must not cost 80 GB: the memfd is sparse.
	m, err := NewSimMemory(GPUDevice(0), 80<<30)
	require.NoError(t, err)
	defer m.Close()
	b, err := m.Alloc(context.Background(), 1<<20)
	require.NoError(t, err)
	p, err := BytesOf(b)
	require.NoError(t, err)
	p[0], p[len(p)-1] = 1, 2
	h, err := ExportOf(b, ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(h.FD, &st))
	assert.Less(t, st.Blocks*512, int64(64<<20), "only the allocation is backed")
	assert.Equal(t, int64(1<<20), st.Size)
}

func TestSimMemoryExportSharesBytes(t *testing.T) {
	m, err := NewSimMemory(GPUDevice(2), 1<<20)
	require.NoError(t, err)
	defer m.Close()
	b, err := m.Alloc(context.Background(), 4096)
	require.NoError(t, err)
	p, _ := BytesOf(b)
	copy(p, "hello arena")
	h, err := b.(Exportable).Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	other, err := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(other)
	assert.Equal(t, "hello arena", string(other[h.Offset:h.Offset+11]))
	require.NoError(t, b.Release())
	assert.Nil(t, b.(HostVisible).Bytes())
	_, err = b.(Exportable).Export(ReadOnly)
	assert.ErrorIs(t, err, ErrReleased)
}

func TestHostMemoryExportSharesBytes(t *testing.T) {
	m := NewHostMemory(0)
	b, err := m.Alloc(context.Background(), 8192)
	require.NoError(t, err)
	p, _ := BytesOf(b)
	copy(p[4096:], "hello host")
	h, err := b.(Exportable).Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	assert.Equal(t, int64(8192), h.Length)
	other, err := unix.Mmap(h.FD, 0, int(h.Size), unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(other)
	assert.Equal(t, "hello host", string(other[4096:4106]))
	require.NoError(t, b.Release())
	_, err = b.(Exportable).Export(ReadOnly)
	assert.ErrorIs(t, err, ErrReleased)
	type plain struct{ Buffer } // hides Export
	live, err := m.Alloc(context.Background(), 16)
	require.NoError(t, err)
	defer live.Release()
	_, err = ExportOf(plain{live}, ReadOnly)
	assert.ErrorIs(t, err, ErrNotExportable)
	h2, err := ExportOf(live, Writable)
	require.NoError(t, err)
	unix.Close(h2.FD)
	empty, err := m.Alloc(context.Background(), 0)
	require.NoError(t, err)
	_, err = empty.(Exportable).Export(ReadOnly)
	assert.Error(t, err)
}

func TestSimMemoryClosedAndCanceled(t *testing.T) {
	m, err := NewSimMemory(GPUDevice(0), 1<<16)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.Alloc(ctx, 1)
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	_, err = m.Alloc(context.Background(), 1)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = NewSimMemory(GPUDevice(0), 0)
	assert.Error(t, err)
}

func TestHostMemory(t *testing.T) {
	m := NewHostMemory(1 << 20)
	b, err := m.Alloc(context.Background(), 512<<10)
	require.NoError(t, err)
	p, err := BytesOf(b)
	require.NoError(t, err)
	p[len(p)-1] = 7
	_, err = m.Alloc(context.Background(), 768<<10)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.NoError(t, b.Release())
	require.NoError(t, b.Release())
	z, err := m.Alloc(context.Background(), 0)
	require.NoError(t, err)
	require.NoError(t, z.Release())
	assert.Equal(t, int64(0), m.Stats().Used)
	assert.Equal(t, 0, m.Stats().Allocs)
}

// Released host buffers come back for allocations of their page-rounded
// size, so a loop of Gets into host memory populates its pages once; an
// exported buffer (another process may map it) never comes back, and the
// cache stays within its limit. A fresh memfd reads as zeros, so a marker
// byte tells a reused mapping from a new one (addresses may repeat after
// an unmap).
func TestHostMemoryReusesReleasedBuffers(t *testing.T) {
	ctx := context.Background()
	m := NewHostMemory(0)
	defer m.Close()
	mark := func(b Buffer, v byte) { p, _ := BytesOf(b); p[0] = v }
	marked := func(b Buffer) byte { p, _ := BytesOf(b); return p[0] }

	a, err := m.Alloc(ctx, 100<<10)
	require.NoError(t, err)
	mark(a, 1)
	require.NoError(t, a.Release())
	assert.Equal(t, int64(100<<10), m.Stats().Cached)
	assert.Equal(t, int64(0), m.Stats().Used)

	b, err := m.Alloc(ctx, 100<<10-5) // same page-rounded size
	require.NoError(t, err)
	assert.Equal(t, byte(1), marked(b), "the released mapping is reused")
	assert.Equal(t, int64(100<<10-5), b.Len())
	p, _ := BytesOf(b)
	assert.Len(t, p, 100<<10-5)
	assert.Equal(t, int64(0), m.Stats().Cached)
	assert.Equal(t, int64(100<<10-5), m.Stats().Used)

	c, err := m.Alloc(ctx, 200<<10) // another size: a new mapping
	require.NoError(t, err)
	assert.Equal(t, byte(0), marked(c))

	// Exported, then released: gone for good.
	h, err := b.(Exportable).Export(ReadOnly)
	require.NoError(t, err)
	unix.Close(h.FD)
	mark(b, 2)
	require.NoError(t, b.Release())
	assert.Equal(t, int64(0), m.Stats().Cached)
	d, err := m.Alloc(ctx, 100<<10)
	require.NoError(t, err)
	assert.Equal(t, byte(0), marked(d), "an exported buffer is never handed out again")

	// The limit bounds what is kept.
	m.SetCacheLimit(150 << 10)
	require.NoError(t, c.Release()) // 200 KiB: over the limit, unmapped
	require.NoError(t, d.Release()) // 100 KiB: kept
	assert.Equal(t, int64(100<<10), m.Stats().Cached)
	m.SetCacheLimit(0)
	assert.Equal(t, int64(0), m.Stats().Cached)

	// Close drops the cache; later allocations fail, live buffers work.
	m.SetCacheLimit(1 << 20)
	live, err := m.Alloc(ctx, 4096)
	require.NoError(t, err)
	e, _ := m.Alloc(ctx, 4096)
	require.NoError(t, e.Release())
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "Close is idempotent")
	assert.Equal(t, int64(0), m.Stats().Cached)
	_, err = m.Alloc(ctx, 1)
	assert.ErrorIs(t, err, ErrClosed)
	mark(live, 3)
	require.NoError(t, live.Release())
	assert.Equal(t, int64(0), m.Stats().Cached, "nothing is cached after Close")
}

func TestTensorViewsShareMemory(t *testing.T) {
	m, err := NewSimMemory(GPUDevice(0), 1<<20)
	require.NoError(t, err)
	defer m.Close()
	x, err := Alloc(context.Background(), m, Uint8, 4, 4)
	require.NoError(t, err)
	all, err := x.SpanBytes()
	require.NoError(t, err)
	for i := range all {
		all[i] = byte(i)
	}
	row, err := x.Slice(0, 2, 3)
	require.NoError(t, err)
	rb, err := row.SpanBytes()
	require.NoError(t, err)
	assert.Equal(t, []byte{8, 9, 10, 11}, rb)
	rb[0] = 99
	assert.Equal(t, byte(99), all[8], "a view writes through to its base")

	_, err = New(x.Buffer(), NewDesc(Uint8, 17))
	assert.ErrorIs(t, err, ErrTooSmall)
	require.NoError(t, x.Release())
	_, err = row.SpanBytes()
	assert.ErrorIs(t, err, ErrReleased)
}

func ExampleSimMemory() {
	gpu, _ := NewSimMemory(GPUDevice(0), 1<<30) // a simulated 1 GiB device
	defer gpu.Close()
	w, _ := Alloc(context.Background(), gpu, BFloat16, 1024, 1024)
	fmt.Println(w, w.Desc().NBytes())
	_, err := Alloc(context.Background(), gpu, Float32, 1<<30)
	fmt.Println(errors.Is(err, ErrOutOfMemory))
	w.Release()
	fmt.Println(gpu.Stats().Used)
	// Output:
	// bfloat16[1024 1024] on gpu:0 2097152
	// true
	// 0
}

// resident counts the pages of p whose memory exists (mincore).
func resident(t *testing.T, p []byte) int {
	t.Helper()
	vec := make([]byte, (len(p)+int(pageSize)-1)/int(pageSize))
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, errno, "mincore")
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestHostPrefault: Prefault's memory is resident before anyone writes
// it, serves the first large allocation that finds no released buffer
// (shrunk to its size and sealed, so a handle reaches that allocation
// alone), and only that one.
func TestHostPrefault(t *testing.T) {
	ctx := context.Background()
	m := NewHostMemory(0)
	defer m.Close()
	require.NoError(t, m.Prefault(8<<20))
	assert.EqualValues(t, 8<<20, m.Stats().Cached)

	small, err := m.Alloc(ctx, 100<<10)
	require.NoError(t, err)
	defer small.Release()
	assert.EqualValues(t, 8<<20, m.Stats().Cached, "under PrefaultMin: fresh memory")

	b, err := m.Alloc(ctx, 3<<20+5)
	require.NoError(t, err)
	defer b.Release()
	p, _ := BytesOf(b)
	assert.Equal(t, (len(p)+int(pageSize)-1)/int(pageSize), resident(t, p), "every page resident before the first write")
	assert.Zero(t, m.Stats().Cached)
	fillBytes(p)

	h, err := b.(Exportable).Export(ReadOnly)
	require.NoError(t, err)
	defer unix.Close(h.FD)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(h.FD, &st))
	assert.EqualValues(t, pageRound(3<<20+5), st.Size, "the file holds the allocation and nothing more")
	seals, err := unix.FcntlInt(uintptr(h.FD), unix.F_GET_SEALS, 0)
	require.NoError(t, err)
	assert.NotZero(t, seals&unix.F_SEAL_GROW)
	assert.NotZero(t, seals&unix.F_SEAL_SHRINK)

	again, err := m.Alloc(ctx, 3<<20+5)
	require.NoError(t, err)
	defer again.Release()
	q, _ := BytesOf(again)
	assert.Zero(t, resident(t, q), "one allocation only: the next gets fresh pages")

	m.Close()
	assert.ErrorIs(t, m.Prefault(1<<20), ErrClosed)
}

func fillBytes(p []byte) {
	for i := range p {
		p[i] = byte(i)
	}
}
