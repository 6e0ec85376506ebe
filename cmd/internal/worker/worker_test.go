package worker

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/rdttest"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// pipeWorker runs Run in this process behind pipes, as the multihost
// harness runs the binary behind stdin/stdout.
type pipeWorker struct {
	t     *testing.T
	in    *io.PipeWriter
	out   *bufio.Scanner
	next  int64
	done  chan error
	ready workerInfo
}

func startPipeWorker(t *testing.T, host string) *pipeWorker {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	w := &pipeWorker{t: t, in: inW, out: bufio.NewScanner(outR), done: make(chan error, 1)}
	w.out.Buffer(nil, 1<<20)
	go func() {
		err := Run(context.Background(), inR, outW, io.Discard, Config{Preset: "dgx-h100", Hosts: 3, Host: host, DeviceMemory: 16 << 20, StallTimeout: 5 * time.Second})
		outW.Close()
		w.done <- err
	}()
	r := w.read()
	require.Equal(t, "ready", r.Event)
	w.ready = *r.Info
	t.Cleanup(func() {
		inW.Close()
		for w.out.Scan() { // drain so the worker never blocks writing
		}
		select {
		case err := <-w.done:
			assert.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("worker did not stop after stdin closed")
		}
	})
	return w
}

func (w *pipeWorker) read() workerReply {
	w.t.Helper()
	require.True(w.t, w.out.Scan(), "worker closed its output: %v", w.out.Err())
	var r workerReply
	require.NoError(w.t, json.Unmarshal(w.out.Bytes(), &r), "%s", w.out.Bytes())
	return r
}

func (w *pipeWorker) call(req workerRequest) workerReply {
	w.t.Helper()
	w.next++
	req.ID = w.next
	b, err := json.Marshal(req)
	require.NoError(w.t, err)
	_, err = w.in.Write(append(b, '\n'))
	require.NoError(w.t, err)
	r := w.read()
	require.Equal(w.t, req.ID, r.ID)
	return r
}

func TestWorkerProtocol(t *testing.T) {
	a := startPipeWorker(t, "h0")
	b := startPipeWorker(t, "h1")
	assert.Equal(t, "h1", b.ready.Host)
	assert.Equal(t, []string{"h0", "h1", "h2"}, b.ready.Cluster.Hosts)

	r := b.call(workerRequest{Op: "connect", Peer: a.ready.Peer, Addrs: a.ready.Addrs})
	require.True(t, r.OK, r.Error)
	put := a.call(workerRequest{Op: "put", Size: 1 << 20, Seed: 9, Device: "gpu:2"})
	require.True(t, put.OK, put.Error)
	assert.Equal(t, int64(1<<20), a.call(workerRequest{Op: "info"}).Info.Used)

	cases := []struct {
		name   string
		worker *pipeWorker
		req    workerRequest
		code   string
		path   string
	}{
		{"rdma from another host", b, workerRequest{Op: "get", Ref: put.Ref, Device: "gpu:1", Seed: 9}, "", "rdma"},
		{"p2p on the owner's host", a, workerRequest{Op: "get", Ref: put.Ref, Device: "gpu:5", Seed: 9}, "", "p2p"},
		{"wrong seed is caught", b, workerRequest{Op: "get", Ref: put.Ref, Device: "gpu:1", Seed: 10}, "corrupt", "rdma"},
		{"forged token", b, workerRequest{Op: "get", Ref: forge(t, put.Ref, func(r *rdt.Ref) { r.Token[0] ^= 1 }), Device: "gpu:1", Seed: 9}, "unauthorized", ""},
		{"stale incarnation", b, workerRequest{Op: "get", Ref: forge(t, put.Ref, func(r *rdt.Ref) { r.Incarnation += 2 }), Device: "gpu:1", Seed: 9}, "stale_ref", ""},
		{"garbage ref", b, workerRequest{Op: "get", Ref: base64.StdEncoding.EncodeToString([]byte("nope")), Device: "gpu:1"}, "malformed_ref", ""},
		{"unknown device", b, workerRequest{Op: "get", Ref: put.Ref, Device: "tpu:0"}, "unknown_device", ""},
		{"bad device", b, workerRequest{Op: "get", Ref: put.Ref, Device: "warp:1"}, "bad_request", ""},
		{"odd size", a, workerRequest{Op: "put", Size: 7}, "bad_request", ""},
		{"out of memory", a, workerRequest{Op: "put", Size: 64 << 20}, "out_of_memory", ""},
		{"unknown op", a, workerRequest{Op: "dance"}, "bad_request", ""},
		{"bad peer", a, workerRequest{Op: "connect", Peer: "x"}, "bad_request", ""},
		{"free by a non-owner", b, workerRequest{Op: "free", Ref: put.Ref}, "not_owner", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.worker.call(c.req)
			assert.Equal(t, c.code == "", r.OK, r.Error)
			assert.Equal(t, c.code, r.Code, r.Error)
			if c.path != "" {
				assert.Equal(t, c.path, r.Path)
			}
			if c.code == "" && c.req.Op == "get" {
				assert.True(t, r.Verified)
				assert.Equal(t, int64(1<<20), r.Bytes)
			}
		})
	}
	require.True(t, a.call(workerRequest{Op: "free", Ref: put.Ref}).OK)
	r = b.call(workerRequest{Op: "get", Ref: put.Ref, Device: "gpu:1", Seed: 9})
	assert.Equal(t, "object_freed", r.Code, r.Error)
	for _, w := range []*pipeWorker{a, b} {
		info := w.call(workerRequest{Op: "info"}).Info
		assert.Zero(t, info.Used, "device memory back to baseline on %s", info.Host)
		assert.Zero(t, info.Objects)
	}
	r = a.call(workerRequest{Op: "exit"})
	assert.True(t, r.OK, r.Error)
}

// forge is the shared helper under the short name this package's tests use.
var forge = rdttest.Forge

// FuzzWorkerRequest feeds arbitrary request lines to a live worker: every
// one must be answered (typed error or result) without a panic or a hang.
func FuzzWorkerRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"op":"info"}`,
		`{"id":2,"op":"put","size":4096,"seed":3,"device":"gpu:1"}`,
		`{"id":3,"op":"get","ref":"VFIB","device":"gpu:0"}`,
		`{"id":4,"op":"free","ref":""}`,
		`{"id":5,"op":"connect","peer":"12D3KooWJo1BJaPShKchEshHWuhphCbfnKToy6LJzyvbQsUwjX6x","addrs":["/ip4/127.0.0.1/tcp/1"],"timeout_ms":50}`,
		`{"id":6,"op":"put","size":-8}`,
		`{"op":"get","device":"cpu:99999999"}`,
		`not json`,
	} {
		f.Add([]byte(s))
	}
	rt := newFuzzWorker(f)
	f.Fuzz(func(t *testing.T, line []byte) {
		var req workerRequest
		if json.Unmarshal(line, &req) != nil {
			return
		}
		if req.Op == "connect" || req.TimeoutMS <= 0 || req.TimeoutMS > 200 {
			req.TimeoutMS = 200 // dials to arbitrary addresses must not slow the fuzzer
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r := rt.handle(ctx, req)
		if !r.OK && r.Code == "" {
			t.Fatalf("failure without a code: %+v", r)
		}
		if r.OK && req.Op == "put" {
			rt.free(ctx, workerRequest{Ref: r.Ref})
		}
	})
}

func newFuzzWorker(f *testing.F) *worker {
	cluster, err := topology.Preset("dgx-h100", 1)
	require.NoError(f, err)
	rt, err := rdt.New(context.Background(), rdt.Config{Cluster: cluster, DeviceMemory: 8 << 20, IgnoreEnv: true, RuntimeDir: f.TempDir()})
	require.NoError(f, err)
	f.Cleanup(func() { rt.Shutdown(context.Background()) })
	w := &worker{rt: rt, started: time.Now(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), objects: map[string]tensor.Tensor{}}
	w.actor, err = rt.Spawn("worker")
	require.NoError(f, err)
	return w
}
