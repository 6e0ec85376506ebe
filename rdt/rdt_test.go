package rdt

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m),
		// libp2p's shared helpers that live for the process.
		goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/transport/tcpreuse.(*ConnMgr).run"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/nat.DiscoverNAT"),
		goleak.IgnoreTopFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
	)
}

type pair struct {
	cluster *topology.Cluster
	a, b    *Runtime
}

func newPair(t *testing.T, mutate func(*Config)) pair {
	t.Helper()
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	dir := t.TempDir() // the test's own device claims
	mk := func(host string) *Runtime {
		cfg := Config{Cluster: cl, Host: host, IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 256 << 20}
		if mutate != nil {
			mutate(&cfg)
		}
		r, err := New(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(ctx) })
		return r
	}
	return pair{cluster: cl, a: mk("h0"), b: mk("h1")}
}

// fill and sameBytes are the shared helpers, under the short names this
// package's tests use everywhere.
var (
	fill      = testhelp.Fill
	sameBytes = testhelp.SameBytes
)

func TestGetPaths(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, err := p.a.Spawn("owner")
	require.NoError(t, err)
	near, err := p.a.Spawn("near")
	require.NoError(t, err)
	far, err := p.b.Spawn("far")
	require.NoError(t, err)

	x := fill(t, p.a, tensor.GPUDevice(0), tensor.BFloat16, 1024, 513)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)

	tests := []struct {
		name     string
		reader   *Actor
		dst      tensor.DeviceID
		path     string
		zeroCopy bool
	}{
		{"same device view", near, tensor.GPUDevice(0), fabric.Local, true},
		{"nvlink peer copy", near, tensor.GPUDevice(5), fabric.P2P, false},
		{"device to host copy", near, tensor.HostDevice, fabric.Local, false},
		{"other host over rdma", far, tensor.GPUDevice(2), fabric.RDMA, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, xfer, err := tc.reader.Fetch(ctx, ref, tc.dst)
			require.NoError(t, err)
			defer got.Release()
			assert.Equal(t, tc.path, xfer.Stats.Transport)
			assert.Equal(t, tc.path, xfer.Plan.Chosen)
			assert.False(t, xfer.Plan.Degraded, "every path here is the best its topology allows")
			assert.Equal(t, tc.zeroCopy, xfer.Stats.ZeroCopy)
			assert.Equal(t, tc.dst, got.Device())
			assert.True(t, got.Desc().Equal(x.Desc()))
			sameBytes(t, x, got)
			if tc.zeroCopy {
				pg, _ := got.SpanBytes()
				px, _ := x.SpanBytes()
				assert.Same(t, &px[0], &pg[0], "a view is the owner's memory")
			}
		})
	}
	// Every copy was returned to its device.
	for _, d := range []tensor.DeviceID{tensor.GPUDevice(5), tensor.HostDevice} {
		m, _ := p.a.Memory(d)
		assert.Equal(t, int64(0), m.Stats().Used, d.String())
	}
	m, _ := p.b.Memory(tensor.GPUDevice(2))
	assert.Equal(t, int64(0), m.Stats().Used)
}

func TestGetSlicedView(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(1), tensor.Float32, 64, 64)
	cols, err := x.Slice(1, 8, 24) // strided: every row, 16 columns
	require.NoError(t, err)
	ref, err := owner.Put(ctx, cols)
	require.NoError(t, err)
	got, err := far.Get(ctx, ref, tensor.GPUDevice(1))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, []int64{64, 16}, got.Desc().Shape)
	assert.Equal(t, []int64{64, 1}, got.Desc().Strides)
	sameBytes(t, cols, got) // the span, as laid out by the owner
}

func TestExplain(t *testing.T) {
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, err := owner.Put(context.Background(), x)
	require.NoError(t, err)

	plan := owner.Explain(ref, tensor.GPUDevice(7))
	assert.Equal(t, fabric.P2P, plan.Chosen)
	assert.Equal(t, "NV18", plan.Path)
	assert.Contains(t, plan.String(), "device link NV18")
	assert.Zero(t, plan.Stripes, "a device link is not striped")

	plan = far.Explain(ref, tensor.GPUDevice(0))
	assert.Equal(t, fabric.RDMA, plan.Chosen)
	assert.Equal(t, fabric.RDMA, plan.Best, "both hosts have RDMA NICs")
	assert.False(t, plan.Degraded)
	assert.Empty(t, plan.Fallback)
	assert.Equal(t, 8, plan.Stripes, "a dgx-h100 stripes over its eight RDMA rails")
	assert.Contains(t, plan.String(), "(striped over up to 8)")
	for _, c := range plan.Candidates {
		switch c.Transport {
		case fabric.Local:
			assert.False(t, c.Usable)
			assert.Contains(t, c.Reason, "another runtime")
		case fabric.P2P, fabric.SHM: // in-process p2p, cross-process p2p and shm
			assert.False(t, c.Usable)
			assert.Regexp(t, "another (runtime|host)", c.Reason)
		}
	}
}

func TestExplainSaysWhatIsMissing(t *testing.T) {
	p := newPair(t, func(c *Config) { c.Transports.DisableRDMA = true })
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, err := owner.Put(context.Background(), x)
	require.NoError(t, err)
	plan := far.Explain(ref, tensor.GPUDevice(0))
	assert.Equal(t, fabric.TCP, plan.Chosen)
	assert.Equal(t, fabric.RDMA, plan.Best, "both hosts have RDMA NICs")
	assert.True(t, plan.Degraded, "tcp is worse than the rdma the topology allows")
	assert.Equal(t, "allowed by the topology but not running in this runtime", plan.Fallback, "the fallback said aloud")
	assert.Contains(t, plan.String(), "DEGRADED: rdma is not available: allowed by the topology but not running in this runtime")
}

func TestDenyListFallsBackLoudly(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, func(c *Config) { c.Transports.Deny = []string{fabric.P2P} })
	owner, _ := p.a.Spawn("owner")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 1<<20)
	ref, _ := owner.Put(ctx, x)
	got, xfer, err := owner.Fetch(ctx, ref, tensor.GPUDevice(1))
	require.NoError(t, err)
	defer got.Release()
	assert.Equal(t, fabric.Local, xfer.Stats.Transport)
	assert.True(t, xfer.Plan.Degraded)
	mfs, err := p.a.Registry().Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "tensorlane_degraded_transfers_total" {
			found = true
			assert.Equal(t, 1.0, mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	assert.True(t, found, "degraded transfers are counted")
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	far, _ := p.b.Spawn("far", WithDevices(tensor.GPUDevice(0)))
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	gpu0, _ := p.a.Memory(tensor.GPUDevice(0))
	baseline := gpu0.Stats().Used

	t.Run("forged token", func(t *testing.T) {
		forged := ref
		forged.Token = bytes.Repeat([]byte{0x42}, 16)
		for _, reader := range []*Actor{owner, far} {
			_, err := reader.Get(ctx, forged, reader.Devices()[len(reader.Devices())-1])
			assert.ErrorIs(t, err, ErrUnauthorized)
		}
	})
	t.Run("unknown object", func(t *testing.T) {
		unknown := ref
		unknown.Object[0] ^= 0xff
		_, err := far.Get(ctx, unknown, tensor.GPUDevice(0))
		assert.ErrorIs(t, err, ErrObjectNotFound)
	})
	t.Run("stale incarnation", func(t *testing.T) {
		stale := ref
		stale.Incarnation++
		_, err := far.Get(ctx, stale, tensor.GPUDevice(0))
		assert.ErrorIs(t, err, ErrStaleRef)
	})
	t.Run("device not allowed", func(t *testing.T) {
		_, err := far.Get(ctx, ref, tensor.GPUDevice(3))
		assert.ErrorIs(t, err, ErrUnknownDevice)
	})
	t.Run("out of memory", func(t *testing.T) {
		mem, _ := p.b.Memory(tensor.GPUDevice(0))
		hog, err := mem.Alloc(ctx, mem.Stats().Free-1024)
		require.NoError(t, err)
		defer hog.Release()
		_, err = far.Get(ctx, ref, tensor.GPUDevice(0))
		assert.ErrorIs(t, err, ErrOutOfMemory)
		var oom *tensor.OutOfMemoryError
		require.True(t, errors.As(err, &oom))
		assert.Equal(t, int64(4096), oom.Requested)
	})
	t.Run("destination too small", func(t *testing.T) {
		mem, _ := p.b.Memory(tensor.GPUDevice(0))
		small, err := tensor.Alloc(ctx, mem, tensor.Uint8, 1000)
		require.NoError(t, err)
		defer small.Release()
		_, err = far.GetInto(ctx, ref, small)
		assert.ErrorIs(t, err, ErrTooSmall)
	})
	t.Run("free then get", func(t *testing.T) {
		assert.ErrorIs(t, far.Free(ctx, ref), ErrNotOwner)
		require.NoError(t, owner.Free(ctx, ref))
		assert.ErrorIs(t, owner.Free(ctx, ref), ErrObjectFreed)
		_, err := far.Get(ctx, ref, tensor.GPUDevice(0))
		assert.ErrorIs(t, err, ErrObjectFreed)
		_, err = owner.Get(ctx, ref, tensor.GPUDevice(0))
		assert.ErrorIs(t, err, ErrObjectFreed)
		assert.Equal(t, baseline-4096, gpu0.Stats().Used, "the owner's arena is back to its size without the object")
	})
	mem, _ := p.b.Memory(tensor.GPUDevice(0))
	assert.Equal(t, int64(0), mem.Stats().Used, "readers leaked nothing")
}

func TestFreeWaitsForViews(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 8192)
	ref, _ := owner.Put(ctx, x)
	view, err := owner.Get(ctx, ref, tensor.GPUDevice(0))
	require.NoError(t, err)
	require.NoError(t, owner.Free(ctx, ref))
	gpu0, _ := p.a.Memory(tensor.GPUDevice(0))
	assert.Equal(t, int64(8192), gpu0.Stats().Used, "a live view keeps the memory")
	pv, err := view.SpanBytes()
	require.NoError(t, err)
	assert.Len(t, pv, 8192)
	require.NoError(t, view.Release())
	assert.Equal(t, int64(0), gpu0.Stats().Used)
}

func TestRefEncoding(t *testing.T) {
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	x := fill(t, p.a, tensor.GPUDevice(3), tensor.BFloat16, 4096, 4096)
	ref, err := owner.Put(context.Background(), x)
	require.NoError(t, err)
	b, err := ref.MarshalBinary()
	require.NoError(t, err)
	assert.Less(t, len(b), 512, "a one-tensor ref is small")
	t.Logf("one-tensor ref: %d bytes", len(b))
	back, err := ParseRef(b)
	require.NoError(t, err)
	assert.Equal(t, ref.Object, back.Object)
	assert.Equal(t, ref.Owner, back.Owner)
	assert.Equal(t, ref.Incarnation, back.Incarnation)
	assert.Equal(t, ref.Addrs, back.Addrs)
	assert.Equal(t, ref.DataAddrs, back.DataAddrs)
	assert.Equal(t, ref.Device, back.Device)
	assert.True(t, ref.Desc.Equal(back.Desc))
	assert.Equal(t, ref.Transports, back.Transports)
	assert.Equal(t, ref.Token, back.Token)
	again, _ := back.MarshalBinary()
	assert.Equal(t, b, again, "encoding is deterministic")

	for i := range b { // every truncation is rejected
		_, err := ParseRef(b[:i])
		require.ErrorIs(t, err, ErrMalformedRef, "truncated at %d", i)
	}
	_, err = ParseRef(append(b, 0))
	assert.ErrorIs(t, err, ErrMalformedRef)
	bad := append([]byte(nil), b...)
	bad[2] = 99
	_, err = ParseRef(bad)
	assert.ErrorIs(t, err, ErrMalformedRef)
}

func FuzzParseRef(f *testing.F) {
	cl, _ := topology.Preset("dgx-h100", 1)
	r, err := New(context.Background(), Config{Cluster: cl, IgnoreEnv: true, RuntimeDir: f.TempDir(), DeviceMemory: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	a, _ := r.Spawn("seed")
	mem, _ := r.Memory(tensor.GPUDevice(0))
	x, _ := tensor.Alloc(context.Background(), mem, tensor.Float16, 3, 5)
	ref, _ := a.Put(context.Background(), x)
	seed, _ := ref.MarshalBinary()
	f.Add(seed)
	f.Add([]byte("TR\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		ref, err := ParseRef(p)
		if err != nil {
			if !errors.Is(err, ErrMalformedRef) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// Whatever decodes must re-encode and describe a valid tensor.
		if err := ref.Desc.Validate(); err != nil {
			t.Fatal(err)
		}
		if _, err := ref.MarshalBinary(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSendReceive(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	alice, _ := p.a.Spawn("alice")
	bob, _ := p.b.Spawn("bob")
	carol, _ := p.a.Spawn("carol")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 64)
	ref, _ := alice.Put(ctx, x)

	require.NoError(t, p.a.Connect(ctx, p.b.AddrInfo()))
	require.NoError(t, alice.Send(ctx, bob.Addr(), Message{Payload: []byte("hi"), Refs: []Ref{ref, ref}}))
	m, err := bob.Receive(ctx)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(m.Payload))
	assert.Len(t, m.Refs, 2)
	assert.Equal(t, alice.Addr().Peer, m.From.Peer)
	assert.Equal(t, "alice", m.From.Name)

	// Reply without a prior Connect from b's side: the sender's addresses
	// ride in the message.
	require.NoError(t, bob.Send(ctx, m.From, Message{Payload: []byte("back")}))
	back, err := alice.Receive(ctx)
	require.NoError(t, err)
	assert.Equal(t, "back", string(back.Payload))

	// In-process delivery.
	require.NoError(t, alice.Send(ctx, carol.Addr(), Message{Payload: []byte("local")}))
	lm, err := carol.Receive(ctx)
	require.NoError(t, err)
	assert.Equal(t, "local", string(lm.Payload))

	nobody := bob.Addr()
	nobody.Name = "nobody"
	assert.ErrorIs(t, alice.Send(ctx, nobody, Message{}), ErrUnknownActor)
	assert.Error(t, alice.Send(ctx, bob.Addr(), Message{Payload: make([]byte, MaxPayload+1)}))

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = carol.Receive(short)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestEnvelopeRejectsGarbage(t *testing.T) {
	for _, p := range [][]byte{nil, {1}, {2, 0}, {1, 200, 1}, bytes.Repeat([]byte{0xff}, 64)} {
		_, _, err := decodeEnvelope(p)
		assert.Error(t, err)
	}
}

func TestShutdown(t *testing.T) {
	ctx := context.Background()
	p := newPair(t, nil)
	owner, _ := p.a.Spawn("owner")
	x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096)
	ref, _ := owner.Put(ctx, x)
	require.NoError(t, p.a.Shutdown(ctx))
	require.NoError(t, p.a.Shutdown(ctx), "idempotent")
	_, err := owner.Put(ctx, x)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = owner.Receive(ctx)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = p.a.Spawn("late")
	assert.ErrorIs(t, err, ErrClosed)
	// A reader on the surviving host gets a typed error, not a hang: it
	// never reached the owner, so it cannot tell death from absence.
	far, _ := p.b.Spawn("far")
	_, err = far.Get(ctx, ref, tensor.GPUDevice(0))
	assert.ErrorIs(t, err, ErrPeerUnreachable)
}

func TestConfigErrors(t *testing.T) {
	ctx := context.Background()
	_, err := New(ctx, Config{Host: "h9", IgnoreEnv: true})
	assert.Error(t, err)
	t.Setenv(fabric.EnvTransports, "tcp,carrier-pigeon")
	_, err = New(ctx, Config{})
	assert.Error(t, err)
}
