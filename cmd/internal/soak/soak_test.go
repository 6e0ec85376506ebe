package soak

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/internal/testhelp"
)

var libp2pBackground = append([]goleak.Option{goleak.IgnoreCurrent()}, testhelp.Libp2pBackground()...)

// TestSoakShort is the ~10 s soak of the issue: random verified transfers
// under kills, cuts, blackholes, delays and forged refs; nothing may hang,
// corrupt or leak, and every error must be typed.
func TestSoakShort(t *testing.T) {
	defer goleak.VerifyNone(t, libp2pBackground...)
	res, err := Run(context.Background(), Config{
		Duration: 8 * time.Second, Runtimes: 3, Concurrency: 4, MaxSize: 4 << 20,
		FaultEvery: 150 * time.Millisecond, Bound: 10 * time.Second, Stall: time.Second, Seed: 42,
	})
	require.NoError(t, err)
	var out bytes.Buffer
	Print(&out, res)
	t.Log(out.String())
	assert.True(t, res.OK)
	assert.Zero(t, res.Hung)
	assert.Zero(t, res.BytesCorrupted)
	assert.Zero(t, res.LeakedBytes)
	assert.Zero(t, res.UntypedErrors, "%v", res.UntypedSamples)
	assert.Zero(t, res.ForgedAccepted)
	assert.Positive(t, res.Transfers)
	assert.Positive(t, res.ErrorsSurfaced)
	// Every attempt is a transfer, a typed error or a named skip (issue 19.7).
	assert.Zero(t, res.Unaccounted(), "attempts %d, outcomes %v", res.Attempts, res.Outcomes)
	assert.Equal(t, res.Transfers, res.Outcomes["transferred"])
	for k := range res.Outcomes {
		assert.Regexp(t, `^(transferred|error|skipped:[a-z_]+)$`, k)
	}
	assert.Contains(t, out.String(), "attempts: ")
	for _, kind := range []string{"kill", "cut", "blackhole", "delay", "forged_token", "forged_incarnation"} {
		assert.Positive(t, res.Faults[kind], "fault %s was injected", kind)
	}
	// A forged token is refused as unauthorized, unless a kill got to its
	// owner first; nothing else is unauthorized.
	assert.Positive(t, res.Errors["get:unauthorized"])
	assert.LessOrEqual(t, res.Errors["get:unauthorized"], res.Faults["forged_token"])
	assert.Positive(t, res.Paths["tcp"])
	// Broadcast faults: a reader that never reserved fails typed (one that
	// "got the data" would be forged_accepted), a reader leaves mid-step.
	assert.Positive(t, res.Errors["broadcast_ghost:object_not_found"], "%v", res.Errors)
	assert.Positive(t, res.Errors["broadcast:reader_left_mid_step"], "%v", res.Errors)
}

func TestSoakBadOptions(t *testing.T) {
	for _, o := range []Config{
		{Runtimes: 1},
		{Concurrency: -1},
		{MaxSize: 4},
		{Duration: -time.Second},
	} {
		_, err := Run(context.Background(), o)
		assert.ErrorIs(t, err, ErrBadConfig, "%+v", o)
	}
}

// TestBoundedCountsHangs checks the hang detector itself: a call that
// outlives its bound is counted, and one that never returns is abandoned.
func TestBoundedCountsHangs(t *testing.T) {
	newSoak := func(bound time.Duration) *soak {
		return &soak{o: Config{Bound: bound}, grace: bound,
			log: slog.New(slog.NewTextHandler(io.Discard, nil)), errCodes: map[string]int64{}}
	}
	// A call that returns is never counted; its bound is generous so that a
	// loaded machine cannot make an empty call look hung.
	quick := newSoak(time.Minute)
	quick.bounded("get", func() {})
	assert.Zero(t, quick.hung.Load())

	s := newSoak(10 * time.Millisecond)
	release := make(chan struct{})
	s.bounded("get", func() { <-release }) // never returns by itself
	close(release)
	assert.Equal(t, int64(1), s.hung.Load())
	assert.Equal(t, int64(1), s.errCodes["hung:get"])
}

func TestCountMismatches(t *testing.T) {
	p := make([]byte, 1000+3)
	worker.FillPattern(p, 11)
	assert.Zero(t, countMismatches(p, 11))
	p[17] ^= 1
	p[500] ^= 0xff
	p[1002] ^= 2
	assert.Equal(t, int64(3), countMismatches(p, 11))
}
