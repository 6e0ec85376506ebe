package tcodec

import (
	"encoding/binary"
	"unsafe"
)

// split scatters k elements of elem bytes from src into elem planes of k
// bytes each, laid out one after another in dst: plane p holds byte p of
// every element (little-endian: plane elem-1 holds sign and exponent).
func split(dst, src []byte, elem, k int) {
	switch elem {
	case 1:
		copy(dst, src)
	case 2:
		// The hot path (bf16, fp16): eight elements per step, two 8-byte
		// loads and two 8-byte stores, through unsafe because bounds
		// checks on every step cost as much as the work. The lengths are
		// checked once, here.
		_, _ = src[:2*k], dst[:2*k]
		s, d0 := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
		d1 := unsafe.Add(d0, k)
		i := 0
		for ; i+8 <= k; i += 8 {
			v0 := binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(s, 2*i)), 8))
			v1 := binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(s, 2*i+8)), 8))
			binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(unsafe.Add(d0, i)), 8), pack(v0)|pack(v1)<<32)
			binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(unsafe.Add(d1, i)), 8), pack(v0>>8)|pack(v1>>8)<<32)
		}
		for ; i < k; i++ {
			dst[i], dst[k+i] = src[2*i], src[2*i+1]
		}
	case 4:
		p0, p1, p2, p3 := dst[:k], dst[k:2*k], dst[2*k:3*k], dst[3*k:4*k]
		for i := range k {
			s := src[4*i : 4*i+4]
			p0[i], p1[i], p2[i], p3[i] = s[0], s[1], s[2], s[3]
		}
	default:
		for i := range k {
			s := src[elem*i : elem*i+elem]
			for p, b := range s {
				dst[p*k+i] = b
			}
		}
	}
}

// join is the inverse of split.
func join(dst, src []byte, elem, k int) {
	switch elem {
	case 1:
		copy(dst, src)
	case 2:
		_, _ = src[:2*k], dst[:2*k]
		s0, d := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
		s1 := unsafe.Add(s0, k)
		i := 0
		for ; i+8 <= k; i += 8 {
			lo := binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(s0, i)), 8))
			hi := binary.LittleEndian.Uint64(unsafe.Slice((*byte)(unsafe.Add(s1, i)), 8))
			binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(unsafe.Add(d, 2*i)), 8), spread(lo)|spread(hi)<<8)
			binary.LittleEndian.PutUint64(unsafe.Slice((*byte)(unsafe.Add(d, 2*i+8)), 8), spread(lo>>32)|spread(hi>>32)<<8)
		}
		for ; i < k; i++ {
			dst[2*i], dst[2*i+1] = src[i], src[k+i]
		}
	case 4:
		p0, p1, p2, p3 := src[:k], src[k:2*k], src[2*k:3*k], src[3*k:4*k]
		for i := range k {
			d := dst[4*i : 4*i+4]
			d[0], d[1], d[2], d[3] = p0[i], p1[i], p2[i], p3[i]
		}
	default:
		for i := range k {
			d := dst[elem*i : elem*i+elem]
			for p := range d {
				d[p] = src[p*k+i]
			}
		}
	}
}

// pack gathers bytes 0, 2, 4 and 6 of v into the low 32 bits.
func pack(v uint64) uint64 {
	v &= 0x00FF00FF00FF00FF
	v = (v | v>>8) & 0x0000FFFF0000FFFF
	return (v | v>>16) & 0xFFFFFFFF
}

// spread is the inverse of pack: the low 4 bytes of v go to bytes 0, 2, 4
// and 6.
func spread(v uint64) uint64 {
	v &= 0xFFFFFFFF
	v = (v | v<<16) & 0x0000FFFF0000FFFF
	return (v | v<<8) & 0x00FF00FF00FF00FF
}
