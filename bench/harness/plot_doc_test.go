package harness

import (
	"os"
	"testing"
)

// TestPlotStoredResults redraws the plots of a stored run into a directory
// given by TENSORLANE_PLOT_OUT (a tool for looking at them, skipped
// otherwise).
func TestPlotStoredResults(t *testing.T) {
	out := os.Getenv("TENSORLANE_PLOT_OUT")
	if out == "" {
		t.Skip("set TENSORLANE_PLOT_OUT to redraw docs/bench's plots there")
	}
	f, err := ReadFile("../../docs/bench/2026-12-03/results.json")
	if err != nil {
		t.Fatal(err)
	}
	files, err := WritePlots(out, f.Records)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(files)
}
