package tcp

import (
	"bufio"
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestCodecErrorsAreFabricCorrupt: tcodec cannot name fabric.ErrCorrupt (it
// sits below fabric), so the link wraps its errors; a caller matches either.
func TestCodecErrorsAreFabricCorrupt(t *testing.T) {
	p := make([]byte, 64<<10)
	tcodec.FillNormal(p, 2, 0.02, 5)
	packed, err := tcodec.NewEncoder().AppendBlock(nil, p, tcodec.HintFor(tensor.BFloat16))
	assert.NoError(t, err)
	raw, err := (&tcodec.Encoder{}).AppendBlock(nil, p, tcodec.Hint{})
	assert.NoError(t, err)
	damage := func(b []byte, at int) []byte {
		b = bytes.Clone(b)
		b[at] ^= 0x20
		return b
	}
	for _, c := range []struct {
		name   string
		stream []byte
		skip   bool // skipBlocks reads the header only, so it sees this one too
	}{
		{"bad version", damage(raw, 2), true},
		{"unknown codec", damage(raw, 0), true},
		{"raw payload flipped", damage(raw, tcodec.HeaderSize+100), false},
		{"packed payload flipped", damage(packed, len(packed)-1), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			link := func() *link {
				bc := bytesConn{r: bytes.NewReader(c.stream)}
				return &link{Conn: bc, r: bufio.NewReaderSize(bc, 4096), stall: time.Second}
			}
			_, err := link().recvBlocks(make([]byte, len(p)), 0, false)
			assert.ErrorIs(t, err, fabric.ErrCorrupt)
			assert.ErrorIs(t, err, tcodec.ErrCorrupt)
			if c.skip {
				err := link().skipBlocks(int64(len(p)))
				assert.ErrorIs(t, err, fabric.ErrCorrupt)
				assert.ErrorIs(t, err, tcodec.ErrCorrupt)
			}
		})
	}
}
