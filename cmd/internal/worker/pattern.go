package worker

import "encoding/binary"

// FillPattern writes the content of object seed: each 8-byte word encodes the
// seed and its position, so a misplaced, stale or corrupted chunk fails
// CheckPattern.
func FillPattern(p []byte, seed uint64) {
	for off := 0; off+8 <= len(p); off += 8 {
		binary.LittleEndian.PutUint64(p[off:], PatternWord(seed, off))
	}
	for off := len(p) &^ 7; off < len(p); off++ {
		p[off] = byte(PatternWord(seed, off))
	}
}

func PatternWord(seed uint64, off int) uint64 {
	return (seed+1)*0xD6E8FEB86659FD93 ^ uint64(off)*0x9E3779B97F4A7C15
}

// CheckPattern returns the offset of the first byte that differs from
// FillPattern(seed), or -1.
func CheckPattern(p []byte, seed uint64) int {
	off := 0
	for ; off+8 <= len(p); off += 8 {
		if binary.LittleEndian.Uint64(p[off:]) != PatternWord(seed, off) {
			for i := 0; i < 8; i++ {
				var want [8]byte
				binary.LittleEndian.PutUint64(want[:], PatternWord(seed, off))
				if p[off+i] != want[i] {
					return off + i
				}
			}
		}
	}
	for ; off < len(p); off++ {
		if p[off] != byte(PatternWord(seed, off)) {
			return off
		}
	}
	return -1
}
