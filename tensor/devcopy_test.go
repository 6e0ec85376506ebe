package tensor

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// wrapped stands for a window of another buffer, forwarding a HostVisible
// that says nothing (as pins over device memory do).
type wrapped struct {
	Buffer
	off, n int64
}

func (w wrapped) Len() int64              { return w.n }
func (w wrapped) Bytes() []byte           { return nil }
func (w wrapped) Unwrap() (Buffer, int64) { return w.Buffer, w.off }
func (w wrapped) Release() error          { return nil }

func TestCopyHostAndSim(t *testing.T) {
	ctx := context.Background()
	host := NewHostMemory(0)
	defer host.Close()
	sim, err := NewSimMemory(GPUDevice(0), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	h, _ := host.Alloc(ctx, 1000)
	s, _ := sim.Alloc(ctx, 1000)
	defer h.Release()
	defer s.Release()
	hp, _ := BytesOf(h)
	for i := range hp {
		hp[i] = byte(i)
	}
	for _, c := range []struct {
		name      string
		dst       Buffer
		dstOff    int64
		src       Buffer
		srcOff, n int64
		err       error
	}{
		{"host to sim", s, 0, h, 0, 1000, nil},
		{"through a wrapper", wrapped{s, 100, 500}, 10, wrapped{h, 200, 300}, 5, 100, nil},
		{"past the end", s, 990, h, 0, 20, ErrTooSmall},
		{"past a wrapper's end", wrapped{s, 0, 10}, 0, h, 0, 20, ErrTooSmall},
		{"negative", s, 0, h, -1, 2, ErrTooSmall},
		{"nothing", s, 0, h, 0, 0, nil},
	} {
		err := Copy(ctx, c.dst, c.dstOff, c.src, c.srcOff, c.n)
		if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
	}
	sp, _ := BytesOf(s)
	want := append([]byte(nil), hp...)
	copy(want[110:210], hp[205:305])
	if !bytes.Equal(sp, want) {
		t.Error("bytes differ")
	}
	if got, off := Unwrap(wrapped{wrapped{s, 3, 10}, 4, 5}); got != s || off != 7 {
		t.Errorf("Unwrap: %v %d", got, off)
	}
	s2, _ := sim.Alloc(ctx, 10)
	s2.Release()
	if err := Copy(ctx, s2, 0, h, 0, 0); err != nil {
		t.Errorf("empty copy into a released buffer: %v", err)
	}
}

func TestImportWithoutImporter(t *testing.T) {
	_, err := Import(context.Background(), Handle{Kind: HandleKind(200)}, nil)
	if !errors.Is(err, ErrNoImporter) {
		t.Fatalf("got %v", err)
	}
	if HandleCUDAFD.String() != "cuda-fd" || HandleKind(200).String() != "handle-kind(200)" {
		t.Error("kind names")
	}
}
