package shm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// helperEnv, when set in a re-executed test binary, makes
// TestHelperProcess an owner process serving objects of the listed sizes.
const helperEnv = "TENSORLANE_SHM_HELPER_SIZES"

// helperViewEnv ("start,end"), when set too, makes the helper publish only
// bytes [start, end) of its first object, shared as rdt shares a view: a
// private copy of the view (tensor.ViewShare).
const helperViewEnv = "TENSORLANE_SHM_HELPER_VIEW"

// helperInfo is what the owner process prints on stdout once it serves.
type helperInfo struct {
	Addr    string         `json:"addr"`
	Echo    string         `json:"echo"` // a seqpacket socket that echoes packets: the latency baseline
	Peer    string         `json:"peer"`
	Token   string         `json:"token"`
	Objects []helperObject `json:"objects"`
}

type helperObject struct {
	ID   string `json:"id"`
	Size int64  `json:"size"`
	Seed uint64 `json:"seed"`
}

// fillWords writes a pattern in which every 8-byte word of an object is
// distinct, so shifted or mixed-up bytes never verify.
func fillWords(p []byte, seed uint64) {
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], seed*0x9e3779b97f4a7c15+uint64(i))
	}
	for ; i < len(p); i++ {
		p[i] = byte(seed) ^ byte(i)
	}
}

// checkWords returns the index of the first byte of p that differs from
// bytes [off, off+len(p)) of an object of objLen bytes filled by
// fillWords(seed), or -1.
func checkWords(p []byte, seed uint64, off, objLen int64) int {
	want := make([]byte, 64<<10)
	full := objLen &^ 7
	for at := 0; at < len(p); at += len(want) {
		w := want[:min(len(want), len(p)-at)]
		for i := range w {
			pos := off + int64(at+i)
			if pos < full {
				w[i] = byte((seed*0x9e3779b97f4a7c15 + uint64(pos&^7)) >> (8 * (pos & 7)))
			} else {
				w[i] = byte(seed) ^ byte(pos)
			}
		}
		if !bytes.Equal(p[at:at+len(w)], w) {
			for i := range w {
				if p[at+i] != w[i] {
					return at + i
				}
			}
		}
	}
	return -1
}

// TestHelperProcess is not a test: the tests re-execute the test binary
// with helperEnv set and -test.run=TestHelperProcess, and it becomes an
// owner process. It serves until its stdin closes (or it is killed).
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs only as the owner process re-executed by the cross-process tests")
	}
	os.Exit(helperMain())
}

func helperMain() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 2 }
	var sizes []int64
	var total int64
	for _, s := range strings.Split(os.Getenv(helperEnv), ",") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fail(err)
		}
		sizes = append(sizes, n)
		total += n + 1<<20
	}
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), total)
	if err != nil {
		return fail(err)
	}
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return fail(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	token := []byte("helper-capability")
	objs := map[fabric.ObjectID]tensor.Buffer{}
	info := helperInfo{Peer: id.String(), Token: hex.EncodeToString(token)}
	alloc := func(n int64, seed uint64) (tensor.Buffer, error) {
		b, err := mem.Alloc(context.Background(), n)
		if err == nil {
			p, _ := tensor.BytesOf(b)
			fillWords(p, seed)
		}
		return b, err
	}
	if lib, mode, ok := strings.Cut(os.Getenv(helperCUDAEnv), ","); ok {
		alloc, err = cudaAlloc(lib, mode)
		if err != nil {
			return fail(err)
		}
	}
	for i, n := range sizes {
		seed := uint64(i + 1)
		b, err := alloc(n, seed)
		if err != nil {
			return fail(err)
		}
		oid := fabric.ObjectID{byte(i + 1), 0xaa}
		objs[oid] = b
		info.Objects = append(info.Objects, helperObject{ID: hex.EncodeToString(oid[:]), Size: n, Seed: seed})
	}
	open := func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
		b, ok := objs[c.Object]
		switch {
		case !ok:
			return nil, fabric.ErrObjectNotFound
		case string(c.Token) != string(token):
			return nil, fabric.ErrUnauthorized
		}
		return nopRelease{b}, nil
	}
	read := open
	if v := os.Getenv(helperViewEnv); v != "" {
		var start, end int64
		if _, err := fmt.Sscanf(v, "%d,%d", &start, &end); err != nil {
			return fail(err)
		}
		first := fabric.ObjectID{1, 0xaa}
		share := tensor.NewViewShare(mem, objs[first], start, end)
		defer share.Release()
		read = func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
			b, err := open(ctx, c)
			if err != nil || c.Object != first {
				return b, err
			}
			if c.Offset < start || c.Length < 0 || c.Offset+c.Length > end {
				return nil, fabric.ErrUnauthorized
			}
			return viewPin{Buffer: objs[first], share: share, end: end}, nil
		}
	}
	// Every object is also a push destination, so a pusher can read back
	// what it wrote.
	srv, err := Listen(ServerConfig{Security: fabric.Security{Identity: key}, Source: fabric.SourceFunc(read), Sink: sinkFunc(open)})
	if err != nil {
		return fail(err)
	}
	info.Addr = srv.Addr()
	info.Echo = strings.TrimSuffix(srv.Addr(), ".sock") + "-echo.sock"
	echo, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: info.Echo, Net: "unixpacket"})
	if err != nil {
		return fail(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	line, _ := json.Marshal(info)
	fmt.Println(string(line))
	io.Copy(io.Discard, os.Stdin) // serve until the parent closes our stdin
	srv.Close()
	return 0
}

type sinkFunc func(ctx context.Context, c fabric.Claim) (tensor.Buffer, error)

func (f sinkFunc) OpenSink(ctx context.Context, c fabric.Claim) (tensor.Buffer, error) {
	return f(ctx, c)
}

type helper struct {
	cmd   *exec.Cmd
	stdin io.Closer
	info  helperInfo
	done  chan struct{} // closed once the process has exited
}

// startHelper starts an owner process serving objects of the given sizes.
func startHelper(t testing.TB, sizes ...int64) *helper {
	t.Helper()
	h, err := tryStartHelper(t, nil, sizes...)
	require.NoError(t, err)
	return h
}

// tryStartHelper is startHelper with process attributes, returning the
// error of starting the process instead of failing.
func tryStartHelper(t testing.TB, attr *syscall.SysProcAttr, sizes ...int64) (*helper, error) {
	t.Helper()
	var list []string
	for _, n := range sizes {
		list = append(list, strconv.FormatInt(n, 10))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(list, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = attr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &helper{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-h.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-h.done
		}
	})
	select {
	case line, ok := <-lines:
		require.True(t, ok, "owner process exited before serving")
		require.NoError(t, json.Unmarshal([]byte(line), &h.info), "owner said %q", line)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatal("owner process did not start serving within 60 s")
	}
	return h, nil
}

// kill sends SIGKILL and waits until the process is gone.
func (h *helper) kill(t testing.TB) {
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-h.done:
	case <-time.After(20 * time.Second):
		t.Fatal("owner process survived SIGKILL for 20 s")
	}
	// A killed owner leaves its socket files; the next Listen in the
	// directory would sweep them, but a test cleans up after itself.
	t.Cleanup(func() {
		os.Remove(h.info.Addr)
		os.Remove(h.info.Echo)
	})
}

func (h *helper) remote(i int, off, n int64) fabric.Remote {
	var oid fabric.ObjectID
	b, _ := hex.DecodeString(h.info.Objects[i].ID)
	copy(oid[:], b)
	tok, _ := hex.DecodeString(h.info.Token)
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: "helper", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer:     h.info.Peer,
		Addrs:    map[string]string{fabric.SHM: h.info.Addr, fabric.P2P: h.info.Addr},
		Claim:    fabric.Claim{Object: oid, Incarnation: 1, Token: tok},
		Offset:   off, Length: n,
	}
}

var parentEndpoint = fabric.Endpoint{Process: "parent", Host: "h0", Device: tensor.GPUDevice(1)}

// TestCrossProcess reads from a real second process, over p2p and shm,
// and verifies every byte.
func TestCrossProcess(t *testing.T) {
	sizes := []int64{1, 4095, 8<<20 + 1, 64 << 20}
	h := startHelper(t, sizes...)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}, Topology: dgx(t)})
	require.NoError(t, err)
	defer cli.Close()
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(1), 80<<20)
	require.NoError(t, err)
	defer mem.Close()
	for _, tr := range []*Transport{cli.P2P(), cli.SHM()} {
		_, ok := tr.Reach(h.remote(0, 0, 1).Endpoint, parentEndpoint)
		require.True(t, ok, "%s reaches the helper", tr.Name())
		for i, n := range sizes {
			t.Run(fmt.Sprintf("%s/%d", tr.Name(), n), func(t *testing.T) {
				dst, err := mem.Alloc(context.Background(), n)
				require.NoError(t, err)
				defer dst.Release()
				got, _ := tensor.BytesOf(dst)
				clear(got)
				st, err := tr.Read(context.Background(), h.remote(i, 0, n), dst)
				require.NoError(t, err)
				assert.Equal(t, tr.Name(), st.Transport)
				assert.Equal(t, n, st.Bytes)
				require.Equal(t, -1, checkWords(got[:n], h.info.Objects[i].Seed, 0, n), "first wrong byte")
				if n > 8 {
					// A sub-range that starts mid-word.
					off, m := n/3+3, n/2
					clear(got)
					_, err := tr.Read(context.Background(), h.remote(i, off, m), dst)
					require.NoError(t, err)
					require.Equal(t, -1, checkWords(got[:m], h.info.Objects[i].Seed, off, n), "first wrong byte of the range")
				}
			})
		}
	}
	s := cli.CacheStats()
	assert.EqualValues(t, len(sizes), s.Mapped, "one mapping per object, shared by both views")
	assert.Positive(t, s.Hits)
}

// TestCrossProcessPush pushes into a buffer of a real second process (its
// pages mapped writable here) and reads it back.
func TestCrossProcessPush(t *testing.T) {
	const n = 16<<20 + 5
	h := startHelper(t, n)
	k, _ := key(t)
	tr, err := New(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	defer tr.Close()
	src, p := hostDst(t, n)
	fillWords(p, 4242)
	for _, r := range [][2]int64{{0, n}, {4097, 1 << 20}} {
		st, err := tr.Write(context.Background(), src, h.remote(0, r[0], r[1]))
		require.NoError(t, err)
		assert.Equal(t, r[1], st.Bytes)
	}
	back, got := hostDst(t, n)
	_, err = tr.Read(context.Background(), h.remote(0, 0, n), back)
	require.NoError(t, err)
	want := append([]byte(nil), p...)
	copy(want[4097:], p[:1<<20])
	require.True(t, bytes.Equal(want, got), "the owner's buffer holds what was pushed")
	s := tr.Client().CacheStats()
	assert.EqualValues(t, 1, s.Push.Mapped, "the sink's pages mapped once")
	assert.EqualValues(t, 1, s.Push.Hits, "the second push reused the mapping")
	assert.EqualValues(t, 1, s.Pull.Mapped, "the read mapped the object apart, read-only")
}

// TestCrossProcessPushOwnerKilled: the owner of the sink dies by SIGKILL
// between the grant and the copy of a push that reuses a cached mapping:
// the push fails with ErrPeerClosed within a bounded time and the dead
// owner's mappings are dropped.
func TestCrossProcessPushOwnerKilled(t *testing.T) {
	const n = 4 << 20
	h := startHelper(t, n)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	defer cli.Close()
	src, p := hostDst(t, n)
	fillWords(p, 7)
	_, err = cli.SHM().Write(context.Background(), src, h.remote(0, 0, n))
	require.NoError(t, err)
	require.Equal(t, 1, cli.CacheStats().Live)

	cli.afterMap = func() { h.kill(t) }
	errc := make(chan error, 1)
	go func() {
		_, err := cli.SHM().Write(context.Background(), src, h.remote(0, 0, n))
		errc <- err
	}()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, fabric.ErrPeerClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("HUNG: push to a killed owner did not return within 30 s")
	}
	cli.afterMap = nil
	s := cli.CacheStats()
	assert.Equal(t, 0, s.Live, "a dead owner's mappings are dropped")
	assert.EqualValues(t, 1, s.Push.Purged)
	assert.EqualValues(t, 1, s.Push.Hits, "the killed push ran on the cached mapping")
}

// TestCrossProcessOwnerKilled: the owner process dies by SIGKILL in the
// middle of a transfer (after the grant, before the copy): the read fails
// with ErrPeerClosed within a bounded time, never reports the copy as
// good, and the dead owner's mappings are dropped.
func TestCrossProcessOwnerKilled(t *testing.T) {
	const n = 32 << 20
	h := startHelper(t, n)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	defer cli.Close()
	dst, _ := hostDst(t, n)
	_, err = cli.SHM().Read(context.Background(), h.remote(0, 0, n), dst)
	require.NoError(t, err)
	require.Equal(t, 1, cli.CacheStats().Live)

	cli.afterMap = func() { h.kill(t) }
	errc := make(chan error, 1)
	go func() {
		_, err := cli.SHM().Read(context.Background(), h.remote(0, 0, n), dst)
		errc <- err
	}()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, fabric.ErrPeerClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("HUNG: read from a killed owner did not return within 30 s")
	}
	cli.afterMap = nil
	s := cli.CacheStats()
	assert.Equal(t, 0, s.Live, "a dead owner's mappings are dropped")
	assert.EqualValues(t, 1, s.Purged)

	_, err = cli.SHM().Read(context.Background(), h.remote(0, 0, n), dst)
	require.ErrorIs(t, err, fabric.ErrPeerClosed, "the owner is gone")
}

// TestCrossProcessKilledUnderLoad: readers loop while the owner is killed
// at an arbitrary point; every read ends verified or with a typed error,
// and none hangs.
func TestCrossProcessKilledUnderLoad(t *testing.T) {
	const n = 8 << 20
	h := startHelper(t, n)
	k, _ := key(t)
	cli, err := NewClient(Config{Security: fabric.Security{Identity: k, StallTimeout: 5 * time.Second}})
	require.NoError(t, err)
	defer cli.Close()
	var wg sync.WaitGroup
	var mu sync.Mutex
	oks, fails := 0, 0
	var firstOK sync.Once
	started := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := tensor.NewHostMemory(0).Alloc(context.Background(), n)
			if err != nil {
				t.Error(err)
				return
			}
			defer b.Release()
			p, _ := tensor.BytesOf(b)
			for range 200 {
				_, err := cli.SHM().Read(context.Background(), h.remote(0, 0, n), b)
				mu.Lock()
				if err == nil {
					oks++
					if bad := checkWords(p, h.info.Objects[0].Seed, 0, n); bad >= 0 {
						t.Errorf("read reported success with a wrong byte at %d", bad)
					}
					if oks == 20 {
						firstOK.Do(func() { close(started) })
					}
				} else {
					fails++
					if !errors.Is(err, fabric.ErrPeerClosed) && !errors.Is(err, fabric.ErrStalled) {
						t.Errorf("untyped error: %v", err)
					}
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	select {
	case <-started:
	case <-time.After(60 * time.Second):
		t.Fatal("fewer than 20 reads succeeded within 60 s")
	}
	h.kill(t)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("HUNG: readers did not finish within 60 s of the owner's death")
	}
	t.Logf("%d reads verified, %d failed with typed errors after the kill", oks, fails)
	assert.Equal(t, 0, cli.CacheStats().Live)
}

// TestCrossNetworkNamespace: runtimes in different network namespaces that
// claim one host still reach each other, because the socket is a path (an
// abstract socket would be invisible across namespaces).
func TestCrossNetworkNamespace(t *testing.T) {
	const n = 4<<20 + 3
	h, err := tryStartHelper(t, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}, n)
	if err != nil {
		t.Skipf("cannot start a process in a new network namespace (needs root or CAP_SYS_ADMIN): %v", err)
	}
	self, err := os.Readlink("/proc/self/ns/net")
	require.NoError(t, err)
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", h.cmd.Process.Pid))
	require.NoError(t, err)
	require.NotEqual(t, self, theirs, "the owner runs in its own network namespace")
	k, _ := key(t)
	tr, err := New(Config{Security: fabric.Security{Identity: k}})
	require.NoError(t, err)
	defer tr.Close()
	dst, got := hostDst(t, n)
	_, err = tr.Read(context.Background(), h.remote(0, 0, n), dst)
	require.NoError(t, err)
	require.Equal(t, -1, checkWords(got[:n], h.info.Objects[0].Seed, 0, n))
}
