package tensor

import (
	"fmt"
	"strings"
)

// DType is an element type. The zero value is Invalid.
type DType uint8

const (
	Invalid DType = iota
	Bool
	Int8
	Int16
	Int32
	Int64
	Uint8
	Float16
	BFloat16
	Float32
	Float64
	Float8E4M3 // float8 e4m3fn (no infinities), as in OCP FP8 and PyTorch float8_e4m3fn
	Float8E5M2
	numDTypes
)

// DLPack data type codes (DLDataTypeCode, DLPack v1.1).
const (
	DLInt          = 0
	DLUInt         = 1
	DLFloat        = 2
	DLBfloat       = 4
	DLBool         = 6
	DLFloat8E4M3FN = 10
	DLFloat8E5M2   = 12
)

type dtypeInfo struct {
	name   string
	bits   int
	dlCode uint8
	float  bool
}

var dtypes = [numDTypes]dtypeInfo{
	Invalid:    {"invalid", 0, 0, false},
	Bool:       {"bool", 8, DLBool, false},
	Int8:       {"int8", 8, DLInt, false},
	Int16:      {"int16", 16, DLInt, false},
	Int32:      {"int32", 32, DLInt, false},
	Int64:      {"int64", 64, DLInt, false},
	Uint8:      {"uint8", 8, DLUInt, false},
	Float16:    {"float16", 16, DLFloat, true},
	BFloat16:   {"bfloat16", 16, DLBfloat, true},
	Float32:    {"float32", 32, DLFloat, true},
	Float64:    {"float64", 64, DLFloat, true},
	Float8E4M3: {"float8_e4m3fn", 8, DLFloat8E4M3FN, true},
	Float8E5M2: {"float8_e5m2", 8, DLFloat8E5M2, true},
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

func (d DType) String() string {
	if d < numDTypes {
		return dtypes[d].name
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the element size in bytes (0 for Invalid).
func (d DType) Size() int64 {
	if !d.Valid() {
		return 0
	}
	return int64(dtypes[d].bits / 8)
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d.Valid() && dtypes[d].float }

// DLPack returns the DLPack (code, bits, lanes) triple of d.
func (d DType) DLPack() (code, bits uint8, lanes uint16) {
	if !d.Valid() {
		return 0, 0, 0
	}
	i := dtypes[d]
	return i.dlCode, uint8(i.bits), 1
}

// FromDLPack maps a DLPack data type to a DType.
func FromDLPack(code, bits uint8, lanes uint16) (DType, error) {
	if lanes != 1 {
		return Invalid, fmt.Errorf("tensor: DLPack dtype with %d lanes is not supported", lanes)
	}
	for d := Bool; d < numDTypes; d++ {
		if dtypes[d].dlCode == code && dtypes[d].bits == int(bits) {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("tensor: unknown DLPack dtype code=%d bits=%d", code, bits)
}

// ParseDType parses a dtype name such as "bf16", "bfloat16", "float32", "f8e4m3".
func ParseDType(s string) (DType, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	aliases := map[string]DType{
		"f16": Float16, "half": Float16, "bf16": BFloat16, "f32": Float32, "float": Float32,
		"f64": Float64, "double": Float64, "i8": Int8, "i16": Int16, "i32": Int32, "i64": Int64,
		"u8": Uint8, "f8e4m3": Float8E4M3, "float8_e4m3": Float8E4M3, "f8e5m2": Float8E5M2,
	}
	if d, ok := aliases[s]; ok {
		return d, nil
	}
	for d := Bool; d < numDTypes; d++ {
		if dtypes[d].name == s {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("tensor: unknown dtype %q", s)
}
