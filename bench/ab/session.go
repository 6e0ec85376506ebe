package ab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/bench/harness"
)

// session is one build measuring one cell: Sample returns one figure,
// higher is better.
type session interface {
	Sample(ctx context.Context) (float64, error)
	Close() error
}

// sampleCell fills cr with cfg.Reps pairs of samples of cell. Each pair
// comes from a fresh process of each build (in serve mode), because a
// process carries an effect of its own for its whole life (where its
// memory landed, which core it started on): one process per build, however
// many rounds it served, showed a build "5% slower" than itself. Within a
// pair the builds alternate round by round, so load hits both alike.
func (cfg *Config) sampleCell(ctx context.Context, open func(context.Context, Build, Cell) (session, error), cell Cell, cr *CellResult) error {
	builds := [2]Build{cfg.Base, cfg.Head}
	rounds := cfg.Rounds
	if cfg.Mode == ModeProcess {
		rounds = 1 // a sample is a whole run already
	} else if cell.Size > 1<<20 {
		// Rounds move about max(1 MiB, size): keep a sample's bytes about
		// what Rounds moves at 1 MiB, but never fewer than 5 rounds.
		rounds = max(5, rounds*(1<<20)/int(min(cell.Size, 1<<40)))
	}
	for i := range cfg.Reps {
		var ss [2]session
		var errs [2]error
		var wg sync.WaitGroup
		for side, b := range builds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ss[side], errs[side] = open(ctx, b, cell)
			}()
		}
		wg.Wait()
		var vals [2][]float64
		err := errors.Join(errs[0], errs[1])
		for j := 0; j < rounds && err == nil; j++ {
			for k := range 2 {
				side := (i + j + k) % 2 // who goes first alternates
				v, serr := ss[side].Sample(ctx)
				if serr != nil {
					err = fmt.Errorf("%s: %w", builds[side].Name, serr)
					break
				}
				vals[side] = append(vals[side], v)
			}
		}
		for side, s := range ss {
			if s != nil {
				if cerr := s.Close(); err == nil && cerr != nil {
					err = fmt.Errorf("%s: %w", builds[side].Name, cerr)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrMeasure, cell, err)
		}
		// A high quantile of a sample's rates (the fast rounds): a round
		// that a burst of load hit is an outlier, not a figure.
		cr.Base = append(cr.Base, quantileOf(vals[0], cfg.Quantile))
		cr.Head = append(cr.Head, quantileOf(vals[1], cfg.Quantile))
	}
	return nil
}

// quantileOf is the q-quantile of xs (nearest rank; 0.5 the median).
func quantileOf(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if q == 0.5 {
		return median(s)
	}
	i := int(q*float64(len(s)-1) + 0.5)
	return s[min(max(i, 0), len(s)-1)]
}

func (cfg *Config) openSession(ctx context.Context, b Build, c Cell) (session, error) {
	if cfg.Mode == ModeProcess {
		return processSession{cfg: cfg, b: b, c: c}, nil
	}
	s, err := startServe(ctx, cfg, b, c)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// processSession runs a whole bench process per sample.
type processSession struct {
	cfg *Config
	b   Build
	c   Cell
}

func (p processSession) Sample(ctx context.Context) (float64, error) {
	return p.cfg.runCell(ctx, p.b, p.c)
}
func (p processSession) Close() error { return nil }

// serveSession is a build's "bench --ab-serve" process holding the cell.
type serveSession struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stdout  *os.File
	r       *bufio.Reader
	stderr  *tailBuffer
	bytes   float64 // moved per round
	cpu     bool
	timeout time.Duration
	once    sync.Once
	err     error
}

func startServe(ctx context.Context, cfg *Config, b Build, c Cell) (*serveSession, error) {
	cmd := exec.Command(b.Exe, "bench", "--ab-serve", c.String())
	cmd.Env = append(os.Environ(), b.Env...)
	s := &serveSession{cmd: cmd, stderr: &tailBuffer{max: 4096}, cpu: cfg.Metric == MetricCPU, timeout: cfg.Timeout}
	cmd.Stderr = s.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe() // an *os.File, so reads can have a deadline
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	pw.Close()
	s.stdin, s.stdout, s.r = stdin, pr, bufio.NewReader(pr)
	line, err := s.readLine(ctx)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("%w (a build older than bench --ab-serve? use --ab-mode process)", err)
	}
	rest, ok := strings.CutPrefix(line, harness.ServeProtocol+" ")
	n, perr := strconv.ParseFloat(rest, 64)
	if !ok || perr != nil || n <= 0 {
		s.Close()
		return nil, fmt.Errorf("%s does not speak %q (built before bench --ab-serve? use --ab-mode process): %q", b.Exe, harness.ServeProtocol, line)
	}
	s.bytes = n
	return s, nil
}

// readLine reads one answer, bounded by the session's timeout.
func (s *serveSession) readLine(ctx context.Context) (string, error) {
	dl := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	if err := s.stdout.SetReadDeadline(dl); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading from %s: %w (its stderr: %s)", s.cmd.Path, err, lastLine(s.stderr.String()))
	}
	return strings.TrimSpace(line), nil
}

func (s *serveSession) Sample(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if _, err := io.WriteString(s.stdin, "r\n"); err != nil {
		return 0, fmt.Errorf("%s: %w (its stderr: %s)", s.cmd.Path, err, lastLine(s.stderr.String()))
	}
	line, err := s.readLine(ctx)
	if err != nil {
		return 0, err
	}
	var wall, cpu int64
	if _, err := fmt.Sscanf(line, "%d %d", &wall, &cpu); err != nil || wall <= 0 {
		return 0, fmt.Errorf("%s answered %q", s.cmd.Path, line)
	}
	d := wall
	if s.cpu {
		// Getrusage counts in scheduler ticks on some kernels: a round
		// can read 0; one nanosecond keeps the rate finite and the
		// median of a sample's rounds makes it harmless.
		d = max(cpu, 1)
	}
	return s.bytes / float64(d), nil // GB/s
}

// Close asks the server to stop, then waits for it a bounded time.
func (s *serveSession) Close() error {
	s.once.Do(func() {
		_, _ = io.WriteString(s.stdin, "q\n")
		s.stdin.Close()
		done := make(chan error, 1)
		go func() { done <- s.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				s.err = fmt.Errorf("%s: %w (its stderr: %s)", s.cmd.Path, err, lastLine(s.stderr.String()))
			}
		case <-time.After(min(s.timeout, 30*time.Second)):
			_ = s.cmd.Process.Kill()
			<-done
			s.err = fmt.Errorf("%s did not stop within %v of being asked; killed", s.cmd.Path, min(s.timeout, 30*time.Second))
		}
		s.stdout.Close()
	})
	return s.err
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}
