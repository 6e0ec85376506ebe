package reshard

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m), testhelp.Libp2pBackground()...)
}

// newRuntime starts a runtime claiming host h of a two-host dgx-h100
// cluster, its device claims in dir.
func newRuntime(ctx context.Context, dir, h string) (*rdt.Runtime, error) {
	return newRuntimeWith(ctx, dir, h, nil)
}

// newRuntimeWith is newRuntime with the config changed by mutate.
func newRuntimeWith(ctx context.Context, dir, h string, mutate func(*rdt.Config)) (*rdt.Runtime, error) {
	cl, err := topology.Preset("dgx-h100", 2)
	if err != nil {
		return nil, err
	}
	cfg := rdt.Config{Cluster: cl, Host: h, IgnoreEnv: true, RuntimeDir: dir, DeviceMemory: 64 << 20}
	if mutate != nil {
		mutate(&cfg)
	}
	return rdt.New(ctx, cfg)
}

// tcpOnly turns the rdma path off: other hosts are reached over tcp.
func tcpOnly(c *rdt.Config) { c.DisableRDMA = true }

// runtimes starts one runtime per host name.
func runtimes(t *testing.T, hosts ...string) []*rdt.Runtime {
	return runtimesWith(t, nil, hosts...)
}

// runtimesWith is runtimes with each config changed by mutate.
func runtimesWith(t *testing.T, mutate func(*rdt.Config), hosts ...string) []*rdt.Runtime {
	t.Helper()
	ctx := context.Background()
	var out []*rdt.Runtime
	dir := t.TempDir()
	for _, h := range hosts {
		r, err := newRuntimeWith(ctx, dir, h, mutate)
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(ctx) })
		out = append(out, r)
	}
	return out
}

// TestReshardFSDPRowsToTPColumns: three trainers hold FSDP rows of a
// weight (two on one host, one on the other), two readers need
// tensor-parallel columns (one per host); the plan is made once and run for
// three steps, every trainer pushing its part to every reader at once, and
// each reader's shard is exactly its columns of that step's weight. Only
// the planned bytes move.
func TestReshardFSDPRowsToTPColumns(t *testing.T) {
	ctx := context.Background()
	shape, elem := []int64{96, 40}, int64(2)
	from := split(t, shape, elem, 0, 3)
	to := split(t, shape, elem, 1, 2)
	p, err := NewPlan(from, to)
	require.NoError(t, err)
	t.Log(p.Explain())

	rts := runtimes(t, "h0", "h1", "h0", "h0", "h1")
	var senders []*Sender
	for i := range 3 {
		a, err := rts[i].Spawn("trainer")
		require.NoError(t, err)
		s, err := NewSender(ctx, a, p, i)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close(ctx) })
		senders = append(senders, s)
	}
	slots := map[Key]rdt.Ref{}
	var receivers []*Receiver
	for j := range 2 {
		a, err := rts[3+j].Spawn("engine")
		require.NoError(t, err)
		r, err := NewReceiver(ctx, a, p, j)
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		for k, v := range r.Slots() {
			slots[k] = v
		}
		receivers = append(receivers, r)
	}
	require.Len(t, slots, len(p.Moves))

	for step := range 3 {
		g := global(shape, elem)
		for i := range g {
			g[i] += byte(step * 17)
		}
		// Every trainer sends at once: many senders, not one rank 0.
		type sent struct {
			xs  []rdt.Transfer
			err error
		}
		done := make(chan sent, len(senders))
		for i, s := range senders {
			src := extract(g, shape, elem, from.Shards[i])
			go func() {
				xs, err := s.Send(ctx, src, slots)
				done <- sent{xs, err}
			}()
		}
		var pushed int64
		for range senders {
			r := <-done
			require.NoError(t, r.err)
			for _, x := range r.xs {
				pushed += x.Stats.Bytes
			}
		}
		assert.Equal(t, p.Bytes(), pushed, "the wire carries the planned bytes, no more")
		for j, r := range receivers {
			dst := make([]byte, to.Bytes(j))
			require.NoError(t, r.Receive(ctx, dst))
			assert.True(t, bytes.Equal(extract(g, shape, elem, to.Shards[j]), dst), "step %d reader %d", step, j)
		}
	}
	assert.Equal(t, int64(len(global(shape, elem))), p.Bytes(), "each reader gets only its columns: the tensor's bytes once in all")
}

// TestReshardReceiverOverLandsInPlace: readers made over their shards'
// memory (NewReceiverOver, senders on another host). Rows to columns: each
// move is one contiguous range of the reader's shard, so all land in place
// and Receive scatters nothing; columns to rows: each move is strided in
// the reader's shard, so it lands in a slot and is scattered. Either way
// the shard is exactly the reader's block of every step's weight; a
// Receive with other memory than the receiver was made over is refused.
func TestReshardReceiverOverLandsInPlace(t *testing.T) {
	ctx := context.Background()
	shape, elem := []int64{96, 40}, int64(2)
	for _, tc := range []struct {
		name     string
		from, to Layout
		inPlace  bool
	}{
		{"rows to columns", split(t, shape, elem, 0, 3), split(t, shape, elem, 1, 2), true},
		{"columns to rows", split(t, shape, elem, 1, 2), split(t, shape, elem, 0, 3), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(tc.from, tc.to)
			require.NoError(t, err)
			hosts := []string{}
			for range tc.from.Shards {
				hosts = append(hosts, "h0")
			}
			for range tc.to.Shards {
				hosts = append(hosts, "h1")
			}
			rts := runtimes(t, hosts...)
			nf := len(tc.from.Shards)
			var senders []*Sender
			for i := range nf {
				a, err := rts[i].Spawn("trainer")
				require.NoError(t, err)
				s, err := NewSender(ctx, a, p, i)
				require.NoError(t, err)
				t.Cleanup(func() { s.Close(ctx) })
				senders = append(senders, s)
			}
			slots := map[Key]rdt.Ref{}
			var receivers []*Receiver
			var dsts [][]byte
			for j := range tc.to.Shards {
				a, err := rts[nf+j].Spawn("engine")
				require.NoError(t, err)
				dst := make([]byte, tc.to.Bytes(j))
				_, err = NewReceiverOver(ctx, a, p, j, dst[1:])
				require.ErrorIs(t, err, tensor.ErrTooSmall)
				r, err := NewReceiverOver(ctx, a, p, j, dst)
				require.NoError(t, err)
				t.Cleanup(func() { r.Close() })
				for _, ip := range r.InPlace() {
					assert.Equal(t, tc.inPlace, ip)
				}
				for k, v := range r.Slots() {
					slots[k] = v
				}
				receivers, dsts = append(receivers, r), append(dsts, dst)
			}
			require.ErrorIs(t, receivers[0].Receive(ctx, make([]byte, tc.to.Bytes(0))), ErrLayout)
			for step := range 2 {
				g := global(shape, elem)
				for i := range g {
					g[i] += byte(step*29 + 1)
				}
				errs := make(chan error, nf)
				for i, s := range senders {
					src := extract(g, shape, elem, tc.from.Shards[i])
					go func() { _, err := s.Send(ctx, src, slots); errs <- err }()
				}
				for range senders {
					require.NoError(t, <-errs)
				}
				for j, r := range receivers {
					require.NoError(t, r.Receive(ctx, dsts[j]))
					assert.True(t, bytes.Equal(extract(g, shape, elem, tc.to.Shards[j]), dsts[j]), "step %d reader %d", step, j)
				}
			}
		})
	}
}

// putShard publishes a shard of n bytes of host memory on actor a: the
// object a sender made over it pushes from, and its bytes, which the test
// rewrites in place each step.
func putShard(t *testing.T, a *rdt.Actor, rt *rdt.Runtime, n int64) (rdt.Ref, []byte) {
	t.Helper()
	ctx := context.Background()
	mem, err := rt.Memory(tensor.HostDevice)
	require.NoError(t, err)
	buf, err := mem.Alloc(ctx, n)
	require.NoError(t, err)
	x, err := tensor.New(buf, tensor.NewDesc(tensor.Uint8, n))
	require.NoError(t, err)
	ref, err := a.Put(ctx, x)
	require.NoError(t, err)
	t.Cleanup(func() { a.Free(ctx, ref) })
	b, err := tensor.BytesOf(buf)
	require.NoError(t, err)
	return ref, b
}

// TestReshardSenderOverGathers: trainers whose shards are rdt objects
// (NewSenderOver) push each move's strided runs straight from them. Over
// tcp and over rdma (softrdma: WRITEs whose scatter-gather lists are the
// runs) nothing is packed (tensorlane_gather_packed_total stays 0).
// For every layout of the table, every reader's shard is exactly its block
// of each step's weight, as the pack path makes it, and only the planned
// bytes cross the wire.
func TestReshardSenderOverGathers(t *testing.T) {
	ctx := context.Background()
	shape, elem := []int64{96, 40}, int64(2)
	type layouts struct {
		name     string
		from, to Layout
	}
	table := []layouts{
		{"rows to columns", split(t, shape, elem, 0, 3), split(t, shape, elem, 1, 2)},
		{"columns to rows", split(t, shape, elem, 1, 2), split(t, shape, elem, 0, 3)},
		{"rows to rows", split(t, shape, elem, 0, 2), split(t, shape, elem, 0, 3)},
		{"columns to columns", split(t, shape, elem, 1, 4), split(t, shape, elem, 1, 3)},
	}
	for _, path := range []struct {
		name   string
		mutate func(*rdt.Config)
		packed bool
	}{{"tcp", tcpOnly, false}, {"rdma", nil, false}} {
		for _, tc := range table {
			t.Run(path.name+"/"+tc.name, func(t *testing.T) {
				p, err := NewPlan(tc.from, tc.to)
				require.NoError(t, err)
				nf, nt := len(tc.from.Shards), len(tc.to.Shards)
				var hosts []string
				for range nf {
					hosts = append(hosts, "h0")
				}
				for range nt {
					hosts = append(hosts, "h1")
				}
				rts := runtimesWith(t, path.mutate, hosts...)
				var senders []*Sender
				var shards [][]byte
				for i := range nf {
					a, err := rts[i].Spawn("trainer")
					require.NoError(t, err)
					ref, mem := putShard(t, a, rts[i], tc.from.Bytes(i))
					_, err = NewSenderOver(ctx, a, p, i, putShardRefOfSize(t, a, rts[i], tc.from.Bytes(i)+1))
					require.ErrorIs(t, err, tensor.ErrTooSmall, "an object of another size than the shard")
					s, err := NewSenderOver(ctx, a, p, i, ref)
					require.NoError(t, err)
					t.Cleanup(func() { s.Close(ctx) })
					senders, shards = append(senders, s), append(shards, mem)
				}
				slots := map[Key]rdt.Ref{}
				var receivers []*Receiver
				var dsts [][]byte
				for j := range nt {
					a, err := rts[nf+j].Spawn("engine")
					require.NoError(t, err)
					dst := make([]byte, tc.to.Bytes(j))
					r, err := NewReceiverOver(ctx, a, p, j, dst)
					require.NoError(t, err)
					t.Cleanup(func() { r.Close() })
					for k, v := range r.Slots() {
						slots[k] = v
					}
					receivers, dsts = append(receivers, r), append(dsts, dst)
				}
				_, err = senders[0].Send(ctx, shards[0], slots)
				require.ErrorIs(t, err, ErrLayout, "a sender over an object sends from it, not from other memory")
				packed0 := 0.0
				for _, rt := range rts[:nf] {
					packed0 += packedCount(t, rt)
				}
				for step := range 2 {
					g := global(shape, elem)
					for i := range g {
						g[i] += byte(step*41 + 3)
					}
					for i := range nf {
						copy(shards[i], extract(g, shape, elem, tc.from.Shards[i]))
					}
					errs := make(chan error, nf)
					var pushed atomic.Int64
					for _, s := range senders {
						go func() {
							xs, err := s.Send(ctx, nil, slots)
							for _, x := range xs {
								pushed.Add(x.Stats.Bytes)
								if err == nil && x.Stats.Transport != path.name {
									err = fmt.Errorf("moved over %s, not %s", x.Stats.Transport, path.name)
								}
							}
							errs <- err
						}()
					}
					for range senders {
						require.NoError(t, <-errs)
					}
					assert.Equal(t, p.Bytes(), pushed.Load(), "the planned bytes, no more")
					for j, r := range receivers {
						require.NoError(t, r.Receive(ctx, dsts[j]))
						assert.True(t, bytes.Equal(extract(g, shape, elem, tc.to.Shards[j]), dsts[j]), "step %d reader %d", step, j)
						seen(r)
					}
				}
				packed := -packed0
				for _, rt := range rts[:nf] {
					packed += packedCount(t, rt)
				}
				if path.packed {
					assert.Equal(t, float64(2*len(p.Moves)), packed, "every move packed on a path without gathered writes, counted")
				} else {
					assert.Zero(t, packed, "nothing packed")
				}
			})
		}
	}
}

func putShardRefOfSize(t *testing.T, a *rdt.Actor, rt *rdt.Runtime, n int64) rdt.Ref {
	ref, _ := putShard(t, a, rt, n)
	return ref
}

// packedCount is the runtime's tensorlane_gather_packed_total, all paths.
func packedCount(t *testing.T, rt *rdt.Runtime) float64 {
	t.Helper()
	mfs, err := rt.Registry().Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "tensorlane_gather_packed_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// seen orders the test's reads of a receiver's in-place memory before the
// next step's writes into it for the race detector: those reach dst after
// the test started the next Send, but through a tcp socket, which it does
// not see; taking each slot's lock (which the sink's owner takes to open
// the slot for the next push) is an edge it does.
func seen(r *Receiver) {
	for _, s := range r.slots {
		s.Pushes()
	}
}
