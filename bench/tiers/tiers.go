package tiers

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tensorlane/tensorlane/bench/ab"
	"github.com/tensorlane/tensorlane/bench/harness"
)

// ErrNoSteps: a results directory without steps.tsv is not a tier's.
var ErrNoSteps = errors.New("tiers: no steps recorded (steps.tsv)")

// Step is one command of a tier, as scripts/tier-step.sh wrote it.
type Step struct {
	Name    string  `json:"name"`
	Status  string  `json:"status"` // "ok", "failed (rc N)", "skipped: why"
	Seconds float64 `json:"seconds"`
}

// OK reports whether the step passed or was skipped with a reason.
func (s Step) OK() bool { return s.Status == "ok" || strings.HasPrefix(s.Status, "skipped") }

// Summary is one run of a tier.
type Summary struct {
	Tier     string             `json:"tier"`
	Time     time.Time          `json:"time"`
	Revision string             `json:"revision,omitempty"`
	Pass     bool               `json:"pass"`
	Steps    []Step             `json:"steps"`
	Figures  map[string]float64 `json:"figures"`
	// Env is the machine's `tensorlane env --json`, when the tier saved it.
	Env json.RawMessage `json:"env,omitempty"`
}

// Collect reads a tier's results directory: steps.tsv (required), and
// when present bench/results.json (bench ratios), ab.json (A/B ratios),
// soak.json (soak counts) and env.json.
func Collect(dir, tier, revision string, now time.Time) (Summary, error) {
	s := Summary{Tier: tier, Time: now.UTC(), Revision: revision, Figures: map[string]float64{}}
	f, err := os.Open(filepath.Join(dir, "steps.tsv"))
	if err != nil {
		return s, fmt.Errorf("%w in %s: %w", ErrNoSteps, dir, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), "\t")
		if len(p) != 3 {
			continue
		}
		sec, _ := strconv.ParseFloat(p[2], 64)
		s.Steps = append(s.Steps, Step{Name: p[0], Status: p[1], Seconds: sec})
		s.Figures["seconds/"+p[0]] = sec
	}
	if len(s.Steps) == 0 {
		return s, fmt.Errorf("%w in %s", ErrNoSteps, dir)
	}
	s.Pass = true
	for _, st := range s.Steps {
		s.Pass = s.Pass && st.OK()
	}
	if b, err := os.ReadFile(filepath.Join(dir, "bench", "results.json")); err == nil {
		var rf harness.File
		if err := json.Unmarshal(b, &rf); err != nil {
			return s, fmt.Errorf("tiers: bench results: %w", err)
		}
		for _, r := range rf.Records {
			if r.Measured() && r.Ratio > 0 {
				s.Figures["bench/"+r.Key()] = r.Ratio
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "ab.json")); err == nil {
		var rep ab.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			return s, fmt.Errorf("tiers: ab.json: %w", err)
		}
		for _, c := range rep.Cells {
			s.Figures["ab/"+c.Cell] = c.Ratio
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "soak.json")); err == nil {
		var soak map[string]any
		if json.Unmarshal(b, &soak) == nil {
			for k, v := range soak {
				if x, ok := v.(float64); ok && !math.IsNaN(x) {
					s.Figures["soak/"+k] = x
				}
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "env.json")); err == nil && json.Valid(b) {
		s.Env = b
	}
	return s, nil
}

// Append adds s, without its environment (the summary beside the results
// keeps it), as one line to the history file.
func Append(history string, s Summary) error {
	s.Env = nil
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(history), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(history, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ReadHistory reads a history file, oldest first; a line that does not
// parse is an error naming it (a history edited by hand should say so).
func ReadHistory(history string) ([]Summary, error) {
	f, err := os.Open(history)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Summary
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var s Summary
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return out, fmt.Errorf("tiers: %s line %d: %w", history, n, err)
		}
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, sc.Err()
}
