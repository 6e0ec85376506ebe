package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Result is one check's outcome.
type Result struct {
	Level   Level   `json:"level"`
	Name    string  `json:"name"`
	State   string  `json:"state"` // "pass", "FAIL", "not run: why"
	Seconds float64 `json:"seconds,omitempty"`
	Output  string  `json:"output,omitempty"` // the tail, when it failed
}

// Report is one point's declared and verified level.
type Report struct {
	Kind     Kind     `json:"kind"`
	Name     string   `json:"name"`
	Declared Level    `json:"declared"`
	Verified Level    `json:"verified"` // -1: not even experimental (or nothing run)
	Ran      bool     `json:"ran"`
	Results  []Result `json:"results"`
}

// OK reports whether no check at or below the declared level failed. A
// level left unverified because a check could not run here (no root, no
// GPU) is reported, not failed: the machine, not the point, fell short.
func (r Report) OK() bool {
	for _, c := range r.Results {
		if c.State == "FAIL" && c.Level <= r.Declared {
			return false
		}
	}
	return true
}

// Verify runs p's checks (from the repository root in dir) when run is
// true, lowest level first, and stops at the first level that fails or
// cannot run: what is above it could not be verified anyway. Each check is
// bounded by timeout.
func Verify(ctx context.Context, p Point, dir string, run bool, timeout time.Duration) Report {
	rep := Report{Kind: p.Kind, Name: p.Name, Declared: p.Declared, Verified: -1, Ran: run}
	blocked := ""
	for l := Experimental; l <= Stable; l++ {
		passed := true
		any := false
		for _, c := range p.Checks {
			if c.Level != l {
				continue
			}
			any = true
			r := Result{Level: l, Name: c.Name}
			switch {
			case !run:
				r.State = "not run (--run)"
				passed = false
			case blocked != "":
				r.State = "not run: " + blocked
				passed = false
			case c.Probe != nil && c.Probe() != nil:
				r.State = "not run: " + c.Probe().Error()
				passed = false
			case len(c.Cmd) == 0:
				r.State = "not run: needs " + c.Needs
				passed = false
			default:
				start := time.Now()
				out, err := runCheck(ctx, dir, c, timeout)
				r.Seconds = time.Since(start).Seconds()
				var ee *exec.ExitError
				switch {
				case errors.As(err, &ee) && ee.ExitCode() == SkipCode:
					r.State = "not run: " + lastLine(out)
					passed = false
				case err != nil:
					r.State, r.Output = "FAIL", tail(out, 2000)
					passed = false
				default:
					r.State = "pass"
				}
			}
			rep.Results = append(rep.Results, r)
		}
		if !any {
			// A level a kind has no check for is not granted silently.
			rep.Results = append(rep.Results, Result{Level: l, Name: "-", State: "not run: no check defined for this level"})
			passed = false
		}
		if passed && blocked == "" {
			rep.Verified = l
		} else if blocked == "" {
			blocked = fmt.Sprintf("%s not verified", l)
		}
	}
	return rep
}

func runCheck(ctx context.Context, dir string, c Check, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Cmd[0], c.Cmd[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w after %v", ctx.Err(), timeout)
	}
	return out.String(), err
}

// SkipCode is the exit status by which a check says it could not run here
// (automake's convention); its last line of output says why.
const SkipCode = 77

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
