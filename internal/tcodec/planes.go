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
		// Four elements per step: one 8-byte load, two 4-byte stores.
		for ; i+4 <= k; i += 4 {
			v := binary.LittleEndian.Uint64(src[2*i:])
			lo := v & 0x00FF00FF00FF00FF
			hi := (v >> 8) & 0x00FF00FF00FF00FF
			lo = (lo | lo>>8) & 0x0000FFFF0000FFFF
			hi = (hi | hi>>8) & 0x0000FFFF0000FFFF
			binary.LittleEndian.PutUint32(p0[i:], uint32(lo|lo>>16))
			binary.LittleEndian.PutUint32(p1[i:], uint32(hi|hi>>16))
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
		for ; i+4 <= k; i += 4 {
			lo := uint64(binary.LittleEndian.Uint32(p0[i:]))
			hi := uint64(binary.LittleEndian.Uint32(p1[i:]))
			lo = (lo | lo<<16) & 0x0000FFFF0000FFFF
			hi = (hi | hi<<16) & 0x0000FFFF0000FFFF
			lo = (lo | lo<<8) & 0x00FF00FF00FF00FF
			hi = (hi | hi<<8) & 0x00FF00FF00FF00FF
			binary.LittleEndian.PutUint64(dst[2*i:], lo|hi<<8)
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
