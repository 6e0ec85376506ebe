package cuda_test

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/tensor/cuda"
)

// Without a usable driver NewMemory says why, and callers fall back to host
// or simulated memory.
func ExampleNewMemory() {
	_, err := cuda.NewMemory(cuda.Config{Library: "/nonexistent/libcuda.so.1"})
	fmt.Println(errors.Is(err, cuda.ErrUnavailable))
	var ue *cuda.UnavailableError
	if errors.As(err, &ue) {
		fmt.Println(ue.Library)
	}
	// Output:
	// true
	// /nonexistent/libcuda.so.1
}
