package tcodec

import "encoding/binary"

// split scatters k elements of elem bytes from src into elem planes of k
// bytes each, laid out one after another in dst: plane p holds byte p of
// every element (little-endian: plane elem-1 holds sign and exponent).
func split(dst, src []byte, elem, k int) {
	switch elem {
	case 1:
		copy(dst, src)
	case 2:
		p0, p1 := dst[:k], dst[k:2*k]
		i := 0
		// Eight elements per step: two 8-byte loads, two 8-byte stores.
		for ; i+8 <= k; i += 8 {
			s := src[2*i : 2*i+16]
			v0, v1 := binary.LittleEndian.Uint64(s), binary.LittleEndian.Uint64(s[8:])
			binary.LittleEndian.PutUint64(p0[i:i+8], pack(v0)|pack(v1)<<32)
			binary.LittleEndian.PutUint64(p1[i:i+8], pack(v0>>8)|pack(v1>>8)<<32)
		}
		for ; i < k; i++ {
			p0[i], p1[i] = src[2*i], src[2*i+1]
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
		p0, p1 := src[:k], src[k:2*k]
		i := 0
		for ; i+8 <= k; i += 8 {
			lo, hi := binary.LittleEndian.Uint64(p0[i:i+8]), binary.LittleEndian.Uint64(p1[i:i+8])
			d := dst[2*i : 2*i+16]
			binary.LittleEndian.PutUint64(d, spread(lo)|spread(hi)<<8)
			binary.LittleEndian.PutUint64(d[8:], spread(lo>>32)|spread(hi>>32)<<8)
		}
		for ; i < k; i++ {
			dst[2*i], dst[2*i+1] = p0[i], p1[i]
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
