package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/internal/workerproto"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/rdt/schema"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// The worker protocol, one JSON object per line.
//
// The driver writes requests on stdin:
//
//	{"id":1,"op":"info"}
//	{"id":2,"op":"connect","peer":"12D3…","addrs":["/ip4/10.0.0.2/tcp/4001"]}
//	{"id":3,"op":"put","size":1048576,"seed":7,"device":"gpu:0"}
//	{"id":4,"op":"get","ref":"<base64>","device":"gpu:1","seed":7,"timeout_ms":5000}
//	{"id":5,"op":"free","ref":"<base64>"}
//	{"id":6,"op":"exit"}
//
// and the worker answers each on stdout with the same id, in completion
// order (requests run concurrently, so a get in flight does not hold up an
// info):
//
//	{"id":4,"ok":true,"bytes":1048576,"seconds":0.01,"path":"tcp","verified":true}
//	{"id":4,"ok":false,"code":"peer_closed","error":"…"}
//
// Before the first request it prints {"event":"ready","info":{…}}. "code"
// names the typed error (see ErrorCode) so a driver in another process can
// tell the conditions apart. Closing stdin, SIGTERM and "exit" all shut the
// runtime down cleanly; SIGKILL is the abrupt death the fault tests want.
// The message types live in internal/workerproto, shared with the driver.
type (
	workerRequest = workerproto.Request
	workerReply   = workerproto.Reply
	workerInfo    = workerproto.Info
	workerMem     = workerproto.Mem
	workerCluster = workerproto.Cluster
)

// Config (config_gen.go) is generated from rdt/schema by rdt/internal/confgen.

// withDefaults fills in the documented defaults of the zero fields.
func (c Config) withDefaults() Config {
	if c.Preset == "" {
		c.Preset = "dgx-h100"
	}
	if c.Hosts == 0 {
		c.Hosts = 3
	}
	if c.Host == "" {
		c.Host = "h0"
	}
	if c.DeviceMemory == 0 {
		c.DeviceMemory = 1 << 30
	}
	return c
}

// LoadIdentity reads a libp2p private key, or creates and stores one
// (schema.LoadIdentity).
func LoadIdentity(path string) (crypto.PrivKey, error) { return schema.LoadIdentity(path) }

// LoadClusterKey reads a 32-byte key, raw or hex-encoded
// (schema.LoadClusterKey).
func LoadClusterKey(path string) ([]byte, error) { return schema.LoadClusterKey(path) }

type worker struct {
	rt      *rdt.Runtime
	actor   *rdt.Actor
	started time.Time
	log     *slog.Logger

	outMu sync.Mutex
	out   *json.Encoder

	mu      sync.Mutex
	objects map[string]tensor.Tensor // object id -> the tensor Put, until freed
	bslots  workerSlots              // slots reserved for broadcasts (bcast.go)
}

// Run starts the worker's runtime and serves the protocol on in and out
// until in closes, an "exit" request, SIGTERM/SIGINT or ctx ends; logs go to
// errOut.
func Run(ctx context.Context, in io.Reader, out, errOut io.Writer, cfg Config) error {
	if ctx == nil {
		ctx = context.Background()
	}
	o := cfg.withDefaults()
	level := slog.LevelInfo
	if o.Verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: level})).With("worker", o.Host)
	cluster, err := topology.Preset(o.Preset, o.Hosts)
	if err != nil {
		return err
	}
	key, err := LoadIdentity(o.IdentityFile)
	if err != nil {
		return err
	}
	clusterKey, err := LoadClusterKey(o.ClusterKeyFile)
	if err != nil {
		return err
	}
	var allow []peer.ID
	for _, s := range o.AllowPeers {
		id, err := peer.Decode(s)
		if err != nil {
			return schema.Bad("allow_peers", "%q is not a peer ID: %v", s, err)
		}
		allow = append(allow, id)
	}
	var rdmaAddrs map[string]string
	if o.RDMAIP != "" {
		h, ok := cluster.Host(o.Host)
		if !ok {
			return fmt.Errorf("host %q is not in %s (hosts %v)", o.Host, cluster.Name, cluster.HostIDs())
		}
		rdmaAddrs = map[string]string{}
		for _, n := range h.NICs {
			if n.RDMA() {
				rdmaAddrs[n.Name] = net.JoinHostPort(o.RDMAIP, "0")
			}
		}
	}
	rt, err := rdt.New(ctx, rdt.Config{
		Cluster: cluster, Host: o.Host, Identity: key, ListenAddrs: o.ListenAddrs, Logger: logger,
		DataAddr: o.DataAddr, AllowTransports: o.AllowTransports, DenyTransports: o.DenyTransports,
		DisableRDMA: o.DisableRDMA, RDMAProvider: o.RDMAProvider,
		ClusterKey: clusterKey, AllowPeers: allow, EncryptData: o.EncryptData,
		DeviceBackend: o.DeviceBackend, DeviceMemory: o.DeviceMemory, HostMemory: o.HostMemory,
		TransferTimeout: o.TransferTimeout, StallTimeout: o.StallTimeout,
		LeaseRenew: o.LeaseRenew, LeaseExpiry: o.LeaseExpiry,
		HeartbeatInterval: o.HeartbeatInterval, HeartbeatMisses: o.HeartbeatMisses,
		// The one setting rdt.Config leaves to the stack: each NIC's rail address.
		Transports: stack.Config{RDMAAddrs: rdmaAddrs},
	})
	if err != nil {
		return err
	}
	w := &worker{rt: rt, started: time.Now(), log: logger, out: json.NewEncoder(out), objects: map[string]tensor.Tensor{}}
	defer rt.Shutdown(context.Background())
	if w.actor, err = rt.Spawn("worker"); err != nil {
		return err
	}

	// Requests run concurrently; cancelling reqCtx aborts those in flight
	// when the worker is told to stop.
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go func() { readErr <- readRequests(reqCtx, in, MaxRequestLine, lines) }()

	info := w.info()
	w.reply(workerReply{Event: "ready", OK: true, Info: &info})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for {
		select {
		case <-sigs:
			logger.Info("signal: shutting down")
			return nil
		case err := <-readErr:
			if err != nil && !errors.Is(err, context.Canceled) {
				// Not a clean end of input: the driver must not mistake it
				// for one (exit status 0).
				logger.Error("reading requests failed: shutting down", "err", err)
				return fmt.Errorf("worker: reading requests: %w", err)
			}
			logger.Info("stdin closed: shutting down")
			return nil
		case <-ctx.Done():
			return nil
		case line := <-lines:
			if line == nil { // longer than MaxRequestLine, skipped
				w.reply(workerReply{ID: -1, Code: "bad_request", Error: fmt.Sprintf("request line longer than %d bytes: skipped", MaxRequestLine)})
				continue
			}
			var req workerRequest
			if err := json.Unmarshal(line, &req); err != nil {
				w.reply(workerReply{ID: -1, Code: "bad_request", Error: "not a JSON request: " + err.Error()})
				continue
			}
			if req.Op == "exit" {
				cancel()
				wg.Wait()
				sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := rt.Shutdown(sctx)
				scancel()
				w.reply(w.result(req.ID, workerReply{}, err))
				return nil
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.reply(w.handle(reqCtx, req))
			}()
		}
	}
}

// MaxRequestLine bounds one request line. Refs are a few hundred bytes, so
// a longer line is a driver bug or an attack: it is skipped and answered
// with bad_request, and the worker goes on.
const MaxRequestLine = 1 << 20

// readRequests sends each line of in (without its newline) on lines. A line
// longer than max is read to its end without being kept and sent as nil. It
// returns nil at the end of input, ctx's error when told to stop, and any
// other read error as it is.
func readRequests(ctx context.Context, in io.Reader, max int, lines chan<- []byte) error {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		var line []byte
		tooLong := false
		for {
			frag, err := br.ReadSlice('\n')
			if !tooLong {
				if len(line)+len(frag) > max+1 { // +1: the newline
					tooLong, line = true, nil
				} else {
					line = append(line, frag...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF && (len(line) > 0 || tooLong) {
				break // a last line without a newline still counts
			}
			if err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			break
		}
		var msg []byte
		if !tooLong {
			msg = bytes.TrimRight(line, "\r\n")
			if len(msg) == 0 {
				continue
			}
		}
		select {
		case lines <- msg:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *worker) reply(r workerReply) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	if err := w.out.Encode(r); err != nil {
		w.log.Warn("cannot write reply", "id", r.ID, "err", err)
	}
}

func (w *worker) result(id int64, r workerReply, err error) workerReply {
	r.ID = id
	r.OK = err == nil
	if err != nil {
		r.Code, r.Error = ErrorCode(err), err.Error()
	}
	return r
}

func (w *worker) handle(ctx context.Context, req workerRequest) workerReply {
	if req.TimeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	switch req.Op {
	case "info":
		info := w.info()
		return workerReply{ID: req.ID, OK: true, Info: &info}
	case "connect":
		return w.result(req.ID, workerReply{}, w.connect(ctx, req))
	case "put":
		r, err := w.put(ctx, req)
		return w.result(req.ID, r, err)
	case "get":
		r, err := w.get(ctx, req)
		return w.result(req.ID, r, err)
	case "free":
		return w.result(req.ID, workerReply{}, w.free(ctx, req))
	}
	if r, ok := w.handleBroadcast(ctx, req); ok { // bcast.go
		return r
	}
	return w.result(req.ID, workerReply{}, fmt.Errorf("%w: unknown op %q (info, connect, put, get, free, reserve, wait, broadcast, close-slot, exit)", errBadWorkerRequest, req.Op))
}

var errBadWorkerRequest = errors.New("bad request")

func (w *worker) info() workerInfo {
	info := workerInfo{Pid: os.Getpid(), Peer: w.rt.ID().String(), Host: w.rt.HostID(), Objects: w.rt.Objects(), Started: w.started}
	for _, a := range w.rt.AddrInfo().Addrs {
		info.Addrs = append(info.Addrs, a.String())
	}
	info.Cluster.Name = w.rt.Cluster().Name
	info.Cluster.Hosts = w.rt.Cluster().HostIDs()
	for _, d := range w.rt.Devices() {
		m, err := w.rt.Memory(d)
		if err != nil {
			continue
		}
		s := m.Stats()
		info.Devices = append(info.Devices, d.String())
		info.Memory = append(info.Memory, workerMem{Device: d.String(), Capacity: s.Capacity, Used: s.Used, Allocs: s.Allocs})
		info.Used += s.Used
		info.Allocs += s.Allocs
	}
	return info
}

func (w *worker) connect(ctx context.Context, req workerRequest) error {
	id, err := peer.Decode(req.Peer)
	if err != nil {
		return fmt.Errorf("%w: peer %q: %v", errBadWorkerRequest, req.Peer, err)
	}
	ai := peer.AddrInfo{ID: id}
	for _, s := range req.Addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return fmt.Errorf("%w: addr %q: %v", errBadWorkerRequest, s, err)
		}
		ai.Addrs = append(ai.Addrs, a)
	}
	return w.rt.Connect(ctx, ai)
}

func (w *worker) device(s string) (tensor.DeviceID, error) {
	if s == "" {
		return tensor.GPUDevice(0), nil
	}
	d, err := tensor.ParseDeviceID(s)
	if err != nil {
		return d, fmt.Errorf("%w: %v", errBadWorkerRequest, err)
	}
	return d, nil
}

func (w *worker) put(ctx context.Context, req workerRequest) (workerReply, error) {
	dev, err := w.device(req.Device)
	if err != nil {
		return workerReply{}, err
	}
	if req.Size <= 0 || req.Size%8 != 0 {
		return workerReply{}, fmt.Errorf("%w: size must be a positive multiple of 8, got %d", errBadWorkerRequest, req.Size)
	}
	mem, err := w.rt.Memory(dev)
	if err != nil {
		return workerReply{}, err
	}
	t, err := tensor.Alloc(ctx, mem, tensor.Uint8, req.Size)
	if err != nil {
		return workerReply{}, err
	}
	p, err := t.SpanBytes()
	if err != nil {
		t.Release()
		return workerReply{}, err
	}
	FillPattern(p, req.Seed)
	ref, err := w.actor.Put(ctx, t)
	if err != nil {
		t.Release()
		return workerReply{}, err
	}
	b, err := ref.MarshalBinary()
	if err != nil {
		return workerReply{}, err
	}
	w.mu.Lock()
	w.objects[ref.Object.String()] = t
	w.mu.Unlock()
	return workerReply{Ref: base64.StdEncoding.EncodeToString(b), Object: ref.Object.String(), Bytes: req.Size}, nil
}

func decodeRef(s string) (rdt.Ref, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return rdt.Ref{}, fmt.Errorf("%w: ref is not base64: %v", rdt.ErrMalformedRef, err)
	}
	return rdt.ParseRef(b)
}

// get reads the ref onto a device, checks every byte against the pattern of
// the seed and releases the copy, so the reader's memory returns to its
// baseline whatever happened.
func (w *worker) get(ctx context.Context, req workerRequest) (workerReply, error) {
	dev, err := w.device(req.Device)
	if err != nil {
		return workerReply{}, err
	}
	ref, err := decodeRef(req.Ref)
	if err != nil {
		return workerReply{}, err
	}
	start := time.Now()
	t, xfer, err := w.actor.Fetch(ctx, ref, dev)
	r := workerReply{Seconds: time.Since(start).Seconds(), Path: xfer.Plan.Chosen}
	if err != nil {
		return r, err
	}
	defer t.Release()
	r.Path, r.Bytes = xfer.Stats.Transport, xfer.Stats.Bytes
	if req.NoVerify {
		return r, nil
	}
	p, err := t.SpanBytes()
	if err != nil {
		return r, err
	}
	if bad := CheckPattern(p, req.Seed); bad >= 0 {
		return r, fmt.Errorf("%w: byte %d of %d differs from the pattern of seed %d", errVerify, bad, len(p), req.Seed)
	}
	r.Verified = true
	return r, nil
}

var errVerify = errors.New("verification failed")

func (w *worker) free(ctx context.Context, req workerRequest) error {
	ref, err := decodeRef(req.Ref)
	if err != nil {
		return err
	}
	if err := w.actor.Free(ctx, ref); err != nil {
		return err
	}
	w.mu.Lock()
	delete(w.objects, ref.Object.String())
	w.mu.Unlock()
	return nil
}
