//go:build !(linux && cgo && nvml)

package topology

import "fmt"

// liveNVML is built in only with the nvml build tag: go-nvml needs cgo and
// its header prints pages of deprecation warnings on every fresh build, so
// the default build (what `go run ./cmd/tensorlane demo` compiles) leaves it
// out and says how to get it.
func liveNVML() ([]nvmlGPU, error) {
	return nil, fmt.Errorf("%w: support not built in (build with -tags nvml and cgo)", errNVMLUnavailable)
}
