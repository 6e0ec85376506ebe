package worker

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPatternCheck(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 4096 + 3} {
		p := make([]byte, n)
		FillPattern(p, 5)
		assert.Equal(t, -1, CheckPattern(p, 5), "n=%d", n)
		if n > 0 {
			p[n-1] ^= 0x40
			assert.Equal(t, n-1, CheckPattern(p, 5), "n=%d", n)
			assert.Equal(t, 0, CheckPattern(p, 6)&^7, "another seed differs in the first word, n=%d", n)
		}
	}
}
