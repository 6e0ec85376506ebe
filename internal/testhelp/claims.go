package testhelp

import "os"

// envRuntimeDir is rdt.EnvRuntimeDir (testhelp cannot import rdt: rdt's
// own tests import testhelp).
const envRuntimeDir = "TENSORLANE_RUNTIME_DIR"

// envIsolated marks the environment of an isolated run, which child
// processes inherit: a test binary a test re-executes keeps the claims
// directory its parent gave it (the test of claims across processes
// points both at one).
const envIsolated = "TENSORLANE_TEST_ISOLATED"

// Isolated wraps m so that its Run gives the test process a device-claims
// directory of its own: TENSORLANE_RUNTIME_DIR points at a fresh private
// temporary directory for the run, removed afterwards. TestMain of every
// package whose tests start runtimes (directly, or through the C ABI, the
// worker, a harness or a child process that inherits the environment)
// runs m through it:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testhelp.Isolated(m), opts...) }
//	func TestMain(m *testing.M) { os.Exit(testhelp.Isolated(m).Run()) }
//
// go test runs packages as parallel processes that simulate the same
// hosts; in the user's claims directory their runtimes would claim the same
// devices and refuse each other, or another user's session on the machine.
// Runtimes configured with IgnoreEnv do not read the variable: those tests
// set Config.RuntimeDir to t.TempDir() themselves. A test binary started
// by an isolated run keeps the directory it was given.
func Isolated(m Runner) Runner { return isolated{m} }

// Runner is what TestMain runs: *testing.M, and what goleak.VerifyTestMain
// takes.
type Runner interface{ Run() int }

type isolated struct{ m Runner }

func (i isolated) Run() int {
	if os.Getenv(envIsolated) != "" && os.Getenv(envRuntimeDir) != "" {
		return i.m.Run()
	}
	dir, err := os.MkdirTemp("", "tensorlane-claims-")
	if err != nil {
		panic("testhelp: claims directory: " + err.Error())
	}
	defer os.RemoveAll(dir)
	defer setenv(envRuntimeDir, dir)()
	defer setenv(envIsolated, "1")()
	return i.m.Run()
}

// setenv sets name to v and returns what restores it.
func setenv(name, v string) (restore func()) {
	prev, had := os.LookupEnv(name)
	os.Setenv(name, v)
	return func() {
		if had {
			os.Setenv(name, prev)
		} else {
			os.Unsetenv(name)
		}
	}
}
