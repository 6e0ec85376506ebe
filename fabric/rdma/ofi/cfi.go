//go:build ofi

package ofi

// The C side: thin wrappers over libfabric's static inline calls, so each
// Go call is one cgo call and no Go pointer is kept by C. Every libfabric
// object lives in C memory; Go holds them as opaque pointers.

/*
#cgo LDFLAGS: -lfabric
#include "cfi.h"
*/
import "C"
