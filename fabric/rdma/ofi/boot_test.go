package ofi

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/tensorlane/tensorlane/fabric"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []bootFrame{{kindCall, 1, []byte("resolve")}, {kindReply, 1<<63 + 5, nil}, {kindError, 7, []byte{4, 'x'}}} {
		got, err := readFrame(bytes.NewReader(appendFrame(nil, f)))
		if err != nil || got.kind != f.kind || got.id != f.id || !bytes.Equal(got.payload, f.payload) {
			t.Fatalf("%+v: got %+v, %v", f, got, err)
		}
	}
}

func TestFrameErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"short header", []byte{1, 0, 0}, io.ErrUnexpectedEOF},
		{"bad kind", appendFrame(nil, bootFrame{kind: 9}), fabric.ErrBadRequest},
		{"kind zero", appendFrame(nil, bootFrame{kind: 0}), fabric.ErrBadRequest},
		{"too long", []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, fabric.ErrBadRequest},
		{"short payload", appendFrame(nil, bootFrame{kind: 1, payload: []byte("abc")})[:15], io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := readFrame(bytes.NewReader(tc.in)); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestTopoName(t *testing.T) {
	for in, want := range map[string]string{"rdmap0s31-rdm": "rdmap0s31", "rdmap0s31-dgrm": "rdmap0s31", "mlx5_0": "mlx5_0", "lo": "lo", "mlx5_1-xrc": "mlx5_1"} {
		if got := topoName(in); got != want {
			t.Errorf("topoName(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(appendFrame(nil, bootFrame{kindCall, 1, []byte("x")}))
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := readFrame(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(fr.payload) > MaxMessage || fr.kind < kindCall || fr.kind > kindPing {
			t.Fatalf("accepted %+v", fr)
		}
		if again, err := readFrame(bytes.NewReader(appendFrame(nil, fr))); err != nil || again.id != fr.id || !bytes.Equal(again.payload, fr.payload) {
			t.Fatalf("round trip of %+v: %+v, %v", fr, again, err)
		}
	})
}
