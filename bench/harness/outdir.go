package harness

import (
	"os"
	"path/filepath"
)

// WriteReport writes a run's report into dir (created if missing):
// results.json (f), one PNG plot per panel of recs and report.md, which
// shows f and links the plots. It returns the files it wrote, results.json
// and report.md first.
func WriteReport(dir string, f File, recs []Record) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	results, report := filepath.Join(dir, "results.json"), filepath.Join(dir, "report.md")
	if err := WriteFile(results, f); err != nil {
		return nil, err
	}
	plots, err := WritePlots(dir, recs)
	if err != nil {
		return nil, err
	}
	md, err := os.Create(report)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(plots))
	for i, p := range plots {
		names[i] = filepath.Base(p) // report.md sits beside them
	}
	err = WriteMarkdown(md, f, names...)
	if cerr := md.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return append([]string{results, report}, plots...), nil
}

// WriteBroadcastReport writes a broadcast run into dir (created if
// missing): broadcast.json and its plot. It returns the two files.
func WriteBroadcastReport(dir string, recs []BroadcastRecord) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, "broadcast.json")
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	err = WriteBroadcastJSON(f, recs)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	png, err := WriteBroadcastPlot(dir, recs)
	if err != nil {
		return nil, err
	}
	return []string{name, png}, nil
}
