package main

import (
	"os"
	"testing"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// The C programs these tests run inherit the test's claims directory.
func TestMain(m *testing.M) { os.Exit(testhelp.Isolated(m).Run()) }
