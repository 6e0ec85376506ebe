package conformance

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestVerifyLevels(t *testing.T) {
	ctx := t.Context()
	p := Point{Kind: Transport, Name: "fake", Declared: Beta, Checks: []Check{
		{Level: Experimental, Name: "a", Cmd: []string{"true"}},
		{Level: Alpha, Name: "b", Cmd: []string{"true"}},
		{Level: Beta, Name: "c", Cmd: []string{"sh", "-c", "echo broken; exit 1"}},
		{Level: Stable, Name: "d", Cmd: []string{"true"}},
	}}
	r := Verify(ctx, p, ".", true, time.Minute)
	if r.Verified != Alpha || r.OK() {
		t.Errorf("verified %v ok %v, want alpha and below the declared beta", r.Verified, r.OK())
	}
	if r.Results[2].State != "FAIL" || !strings.Contains(r.Results[2].Output, "broken") {
		t.Errorf("beta result %+v", r.Results[2])
	}
	if !strings.HasPrefix(r.Results[3].State, "not run: beta not verified") {
		t.Errorf("stable ran above a failed level: %+v", r.Results[3])
	}

	// A check whose needs are missing leaves its level unverified, and a
	// level without a check is never granted.
	p.Checks[2] = Check{Level: Beta, Name: "c", Cmd: []string{"true"}, Needs: "root", Probe: func() error { return errors.New("not root") }}
	p.Checks = p.Checks[:3]
	p.Declared = Alpha
	r = Verify(ctx, p, ".", true, time.Minute)
	if r.Verified != Alpha || !r.OK() || r.Results[2].State != "not run: not root" || r.Results[3].State != "not run: no check defined for this level" {
		t.Errorf("report %+v", r)
	}

	// Without run nothing is judged.
	if r := Verify(ctx, p, ".", false, time.Minute); r.Verified != -1 || !r.OK() {
		t.Errorf("not run: %+v", r)
	}

	// Exit status 77 is a check saying it cannot run here.
	p.Checks = []Check{{Level: Experimental, Name: "skip", Cmd: []string{"sh", "-c", "echo no cases yet; exit 77"}}}
	if r := Verify(ctx, p, ".", true, time.Minute); r.Results[0].State != "not run: no cases yet" || r.Verified != -1 {
		t.Errorf("skipped check: %+v", r)
	}

	// A check that hangs is bounded.
	p.Checks = []Check{{Level: Experimental, Name: "hang", Cmd: []string{"sleep", "60"}}}
	start := time.Now()
	if r := Verify(ctx, p, ".", true, 200*time.Millisecond); r.Results[0].State != "FAIL" || time.Since(start) > 30*time.Second {
		t.Errorf("hung check: %+v after %v", r.Results[0], time.Since(start))
	}
}

// TestPointsAreDefined: every point names its kind, and every check either
// has a command or says what it needs.
func TestPointsAreDefined(t *testing.T) {
	seen := map[Kind]bool{}
	for _, p := range Points() {
		seen[p.Kind] = true
		for _, c := range p.Checks {
			if len(c.Cmd) == 0 && c.Needs == "" {
				t.Errorf("%s %s: check %s has neither a command nor needs", p.Kind, p.Name, c.Name)
			}
		}
	}
	for _, k := range Kinds[1:] { // device plugins come from topology
		if !seen[k] {
			t.Errorf("no point of kind %s", k)
		}
	}
	for l := Experimental; l <= Stable; l++ {
		if Demands[l] == "" {
			t.Errorf("level %s demands nothing", l)
		}
	}
}
