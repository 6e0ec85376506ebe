package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ServeProtocol is the version of the line protocol Serve speaks; the A/B
// guard (bench/ab) checks it in the first line.
const ServeProtocol = "tensorlane-ab 1"

// Serve sets up one cell (path, mode, size, c transfers in flight) of the
// matrix, warms it up, and then times one round of it for every "r" line it
// reads from in, answering "<wall ns> <cpu ns>" on out; "q" or the end of
// in closes the cell. It is the child half of the A/B guard: two builds
// serve the same cell side by side and the guard alternates rounds between
// them a few milliseconds apart, far closer than two runs of the bench can
// be, so that load on a shared machine hits both alike.
//
// The first line out is ServeProtocol and the bytes a round moves. Every
// runtime Serve starts is closed before it returns.
func Serve(ctx context.Context, cfg Config, path, mode string, size int64, c int, in io.Reader, out io.Writer) (err error) {
	cfg.Paths, cfg.Push, cfg.NoLatency = nil, nil, true
	cfg, err = cfg.withDefaults()
	if err != nil {
		return err
	}
	spec := cellSpec{path, mode}
	valid := slices.Contains(slices.Concat(AllPaths, OptInPaths), path) && (mode == ModePull || mode == ModePush && slices.Contains(slices.Concat(PushPaths, OptInPaths), path))
	if !valid || size <= 0 || c < 1 {
		return fmt.Errorf("harness: serve: no cell %s/%s/%s/c%d", path, mode, SizeString(size), c)
	}
	specs := []cellSpec{spec}
	env, err := newEnv(ctx, cfg, specs, false)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.close()) }()
	sz, err := env.prepare(ctx, size, specs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sz.close()) }()
	g, err := sz.group(ctx, spec, c)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.close()) }()
	measure, err := slowed(path, g.measure())
	if err != nil {
		return err
	}
	// As a bench cell: a round moves about 1 MiB, so small sizes are not
	// timer-bound.
	k := max(1, int((1<<20+size*int64(c)-1)/(size*int64(c))))
	for range 3 { // connections, page faults, first-use allocations
		if _, err := round(ctx, measure, c, k); err != nil {
			return err
		}
	}
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "%s %d\n", ServeProtocol, int64(k)*int64(c)*size)
	if err := w.Flush(); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch strings.TrimSpace(sc.Text()) {
		case "r":
			cpu0 := cpuTime()
			d, err := round(ctx, measure, c, k)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%d %d\n", d.Nanoseconds(), (cpuTime() - cpu0).Nanoseconds())
			if err := w.Flush(); err != nil {
				return err
			}
		case "q":
			return nil
		default:
			return fmt.Errorf("harness: serve: unknown request %q", sc.Text())
		}
	}
	return sc.Err()
}
