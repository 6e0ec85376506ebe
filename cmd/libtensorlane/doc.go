// Command libtensorlane is tensorlane's C ABI, built as a shared library:
//
//	go build -buildmode=c-shared -o libtensorlane.so ./cmd/libtensorlane
//
// C, C++, Python (the tensorlane package in python/ loads it with ctypes)
// and Go code loaded into another runtime's process (a Go actor in a Ray
// worker, as GoRay runs them) call it through tensorlane.h: runtimes behind
// uint64 handles, configured with JSON; memory as pointer and length; Refs
// as opaque bytes; errors as a kind (TL_E_*, rdt.ErrorKind's names) and a
// per-thread message (tl_last_error). cmd/internal/capi holds the logic; this
// package only converts values at the boundary and recovers every panic.
//
// Loaded into a process that is not a Go program, the Go runtime starts its
// own threads and installs handlers only for the signals it needs to run
// (synchronous faults such as SIGSEGV raised in Go code, SIGURG for
// goroutine preemption, SIGPROF when profiling); the library never calls
// signal.Notify, so SIGINT, SIGTERM and SIGCHLD stay with the host (Python
// keeps raising KeyboardInterrupt). A fault in C or Python code is not
// turned into a Go panic. Call tl_shutdown_all before the process exits
// (the Python package does so with atexit) so peers see the runtimes leave
// instead of declaring them dead after missed heartbeats; a process that
// exits without it leaks nothing (all memory is the process's own) but its
// readers wait for the failure detector.
package main
