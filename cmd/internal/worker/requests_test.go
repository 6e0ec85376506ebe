package worker

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadRequests(t *testing.T) {
	long := strings.Repeat("x", 100)
	cases := []struct {
		name string
		in   string
		want []string // "<nil>" stands for a skipped, too long line
	}{
		{"lines", "a\nb\n", []string{"a", "b"}},
		{"last line without newline", "a\nb", []string{"a", "b"}},
		{"blank lines and CRLF", "\n\na\r\n", []string{"a"}},
		{"exactly max", strings.Repeat("y", 64) + "\n", []string{strings.Repeat("y", 64)}},
		{"too long, then more", long + "\n{\"op\":\"info\"}\n", []string{"<nil>", `{"op":"info"}`}},
		{"too long at the end", "a\n" + long, []string{"a", "<nil>"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lines := make(chan []byte, 16)
			// A tiny reader buffer would hide nothing: bufio's minimum is 16.
			require.NoError(t, readRequests(context.Background(), strings.NewReader(c.in), 64, lines))
			close(lines)
			var got []string
			for l := range lines {
				if l == nil {
					got = append(got, "<nil>")
				} else {
					got = append(got, string(l))
				}
			}
			assert.Equal(t, c.want, got)
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReadRequestsError(t *testing.T) {
	err := readRequests(context.Background(), failingReader{}, 64, make(chan []byte))
	assert.ErrorContains(t, err, "disk on fire")
}

// One request line over the limit is answered with bad_request and the
// worker goes on serving (issue 29, item 15: it used to shut down as if
// stdin had closed, with exit status 0).
func TestWorkerSurvivesOversizedLine(t *testing.T) {
	w := startPipeWorker(t, "h0")
	_, err := w.in.Write([]byte(strings.Repeat("z", MaxRequestLine+10) + "\n"))
	require.NoError(t, err)
	r := w.read()
	assert.Equal(t, int64(-1), r.ID)
	assert.Equal(t, "bad_request", r.Code)
	assert.Contains(t, r.Error, "longer than")
	info := w.call(workerRequest{Op: "info"})
	assert.True(t, info.OK, "the worker still answers: %+v", info)
}

// A read error on stdin is not a clean end: Run says so.
func TestWorkerReadErrorIsAnError(t *testing.T) {
	err := Run(context.Background(), io.MultiReader(strings.NewReader(""), failingReader{}), io.Discard, io.Discard,
		Config{Preset: "dgx-h100", Hosts: 1, Host: "h0", DeviceMemory: 16 << 20})
	assert.ErrorContains(t, err, "disk on fire")
}
