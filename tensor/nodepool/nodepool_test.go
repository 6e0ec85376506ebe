package nodepool

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// TestMain doubles as the helper process for TestSpawnedHelperEndsWithItsClients:
// with NODEPOOL_TEST_HELPER set it serves the socket named by --socket.
func TestMain(m *testing.M) {
	if os.Getenv("NODEPOOL_TEST_HELPER") == "1" {
		sock := ""
		for i, a := range os.Args {
			if a == "--socket" && i+1 < len(os.Args) {
				sock = os.Args[i+1]
			}
		}
		err := Serve(context.Background(), Config{Socket: sock, Budget: 8 << 20, Idle: 300 * time.Millisecond})
		if err != nil && !errors.Is(err, ErrRunning) {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serve runs a helper in this process until the test ends; done is
// closed when Serve returns, *err its result.
func serve(t *testing.T, cfg Config) (socket string, done <-chan struct{}, err *error) {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = SocketPath(t.TempDir())
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var res error
	go func() {
		res = Serve(ctx, cfg)
		close(ch)
	}()
	t.Cleanup(func() {
		cancel()
		<-ch
	})
	// Return once the helper listens: a client that dials before that
	// waits retryEvery (2 s) for its next try.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if _, err := os.Stat(cfg.Socket); err == nil {
			break
		}
		select {
		case <-ch:
			return cfg.Socket, ch, &res // it ended (ErrRunning, a bad config): the test looks at res
		default:
		}
	}
	return cfg.Socket, ch, &res
}

func connected(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Connected(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitReady waits until the helper holds want ready bytes.
func waitReady(t *testing.T, c *Client, want int64) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		st, err := c.ServerStats(context.Background())
		if err == nil && st.Ready == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper ready bytes: %+v (%v), want %d", st, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resident is how many of fd's pages are in memory (mincore over a
// fresh read-only mapping: it faults nothing in).
func resident(t *testing.T, fd int, n int64) int64 {
	t.Helper()
	data, err := unix.Mmap(fd, 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(data)
	vec := make([]byte, (n+4095)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&data[0])), uintptr(len(data)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	var in int64
	for _, v := range vec {
		in += int64(v & 1)
	}
	return in * 4096
}

func TestTakeServesPopulatedMemory(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	sock, _, _ := serve(t, Config{Budget: 16 << 20})
	c := Open(sock, nil, nil)
	defer c.Close()
	connected(t, c)
	waitReady(t, c, 16<<20) // nothing asked yet: the whole budget in one segment

	fd, n, err := c.Take(context.Background(), 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if n != 16<<20 {
		t.Fatalf("took %d bytes, want the one 16 MiB segment", n)
	}
	if got := resident(t, fd, n); got != n {
		t.Fatalf("%d of %d bytes resident", got, n)
	}
	// The helper refills with the size asked for (rounded to 2 MiB).
	waitReady(t, c, 4<<20)
	fd2, n2, err := c.Take(context.Background(), 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd2)
	if n2 != 4<<20 {
		t.Fatalf("second take %d bytes, want 4 MiB", n2)
	}
	st := c.Stats()
	if !st.Connected || st.Hits != 2 || st.Misses != 0 || st.Absent != 0 || st.Taken != 20<<20 {
		t.Fatalf("client stats %+v", st)
	}
}

func TestMissesAreCounted(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	cases := []struct {
		name string
		size int64
	}{
		{"over the budget", 64 << 20},
		{"nothing ready that large", 12 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock, _, _ := serve(t, Config{Budget: 16 << 20})
			c := Open(sock, nil, nil)
			defer c.Close()
			connected(t, c)
			waitReady(t, c, 16<<20)
			if tc.size <= 16<<20 {
				fd, _, err := c.Take(context.Background(), 10<<20) // takes the one segment
				if err != nil {
					t.Fatal(err)
				}
				unix.Close(fd)
			}
			_, _, err := c.Take(context.Background(), tc.size)
			if !errors.Is(err, ErrEmpty) {
				t.Fatalf("take %d: %v, want ErrEmpty", tc.size, err)
			}
			if st := c.Stats(); st.Misses != 1 {
				t.Fatalf("client stats %+v", st)
			}
		})
	}
}

func TestAbsentHelperFallsBack(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	c := Open(SocketPath(t.TempDir()), nil, nil)
	defer c.Close()
	if _, _, err := c.Take(context.Background(), 1<<20); !errors.Is(err, ErrAbsent) {
		t.Fatalf("take without a helper: %v, want ErrAbsent", err)
	}
	if st := c.Stats(); st.Connected || st.Absent != 1 {
		t.Fatalf("client stats %+v", st)
	}
}

func TestOneHelperPerSocket(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	sock, _, _ := serve(t, Config{Budget: 4 << 20})
	c := Open(sock, nil, nil)
	defer c.Close()
	connected(t, c)
	if err := Serve(context.Background(), Config{Socket: sock}); !errors.Is(err, ErrRunning) {
		t.Fatalf("second helper: %v, want ErrRunning", err)
	}
}

func TestHelperEndsWhenItsClientsAreGone(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	sock, done, res := serve(t, Config{Budget: 4 << 20, Idle: 200 * time.Millisecond})
	for _, err := os.Stat(sock); err != nil; _, err = os.Stat(sock) {
		time.Sleep(time.Millisecond) // connect before the helper's idle end
	}
	c := Open(sock, nil, nil)
	connected(t, c)
	select {
	case <-done:
		t.Fatalf("helper ended with a client connected: %v", *res)
	case <-time.After(600 * time.Millisecond):
	}
	c.Close()
	c.Close() // idempotent
	<-done
	if *res != nil {
		t.Fatal(*res)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// TestSpawnedHelperEndsWithItsClients starts the helper as a client
// would (a detached process), and checks that it ends, leaving no process,
// once its last client is gone.
func TestSpawnedHelperEndsWithItsClients(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after serve's cleanup
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	// The launcher detaches the helper and returns, as the Python one does.
	script := `NODEPOOL_TEST_HELPER=1 "$0" "$@" & echo $! > ` + pidFile
	helper := []string{"/bin/sh", "-c", script, self}
	sock := SocketPath(dir)
	c1 := Open(sock, helper, nil)
	c2 := Open(sock, helper, nil)
	connected(t, c1)
	connected(t, c2)
	fd, _, err := c1.Take(context.Background(), 1<<20)
	for deadline := time.Now().Add(20 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // the first fill is under way
		fd, _, err = c1.Take(context.Background(), 1<<20)
	}
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.Close()
	for deadline := time.Now().Add(30 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			exec.Command("kill", strconv.Itoa(pid)).Run()
			t.Fatalf("helper %d still runs with no client", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie has ended: its launcher, our
// child, may not have been reaped yet).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestFillFollowsTheSizesAsked: a small request does not take (and waste)
// a segment made for a much larger one; the helper learns the sizes asked
// for, freeing segments that fit none of them, within its budget.
func TestFillFollowsTheSizesAsked(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	sock, _, _ := serve(t, Config{Budget: 192 << 20})
	c := Open(sock, nil, nil)
	defer c.Close()
	connected(t, c)
	waitReady(t, c, 192<<20) // nothing asked yet: 96 and 96 MiB (firstPiece)
	take := func(size int64) (int64, error) {
		fd, n, err := c.Take(context.Background(), size)
		if err == nil {
			unix.Close(fd)
		}
		return n, err
	}
	if _, err := take(8 << 20); !errors.Is(err, ErrEmpty) {
		t.Fatalf("8 MiB from 96 MiB segments: %v, want a miss", err)
	}
	waitReady(t, c, 104<<20) // a 96 MiB segment fits nothing asked: freed for an 8 MiB one
	if n, err := take(8 << 20); err != nil || n != 8<<20 {
		t.Fatalf("8 MiB: %d, %v", n, err)
	}
	if _, err := take(160 << 20); !errors.Is(err, ErrEmpty) {
		t.Fatalf("160 MiB: %v, want a miss", err)
	}
	waitReady(t, c, 168<<20) // both sizes ready, within the budget
	if n, err := take(160 << 20); err != nil || n != 160<<20 {
		t.Fatalf("160 MiB: %d, %v", n, err)
	}
	if st := c.Stats(); st.Hits != 2 || st.Misses != 2 {
		t.Fatalf("client stats %+v", st)
	}
}

// TestFirstPieceLadder: before anything is asked a budget is filled as
// halving segments down to 64 MiB, then the rest.
func TestFirstPieceLadder(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		budget int64
		want   []int64
	}{
		{16 * mib, []int64{16 * mib}},
		{64 * mib, []int64{64 * mib}},
		{100 * mib, []int64{100 * mib}},
		{128 * mib, []int64{64 * mib, 64 * mib}},
		{192 * mib, []int64{96 * mib, 96 * mib}},
		{512 * mib, []int64{256 * mib, 128 * mib, 64 * mib, 64 * mib}},
		{1024*mib + 3, []int64{512 * mib, 256 * mib, 128 * mib, 64 * mib, 64 * mib}},
	}
	for _, tc := range cases {
		var got []int64
		for free := tc.budget; ; {
			p := firstPiece(free)
			if p == 0 {
				break
			}
			got = append(got, p)
			free -= p
		}
		assert.Equal(t, tc.want, got, "budget %d MiB", tc.budget/mib)
	}
}

// TestFirstAsksHit: the node's first asks, small and large, find a
// segment of the ladder (no miss, so no fresh pages on a first transfer).
func TestFirstAsksHit(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	sock, _, _ := serve(t, Config{Budget: 256 << 20})
	c := Open(sock, nil, nil)
	defer c.Close()
	connected(t, c)
	waitReady(t, c, 256<<20) // 128, 64 and 64 MiB
	for _, tc := range []struct{ ask, got int64 }{{40 << 20, 64 << 20}, {100 << 20, 128 << 20}, {64 << 20, 64 << 20}} {
		fd, n, err := c.Take(context.Background(), tc.ask)
		require.NoError(t, err, "ask %d MiB", tc.ask>>20)
		unix.Close(fd)
		assert.Equal(t, tc.got, n, "ask %d MiB", tc.ask>>20)
	}
	if st := c.Stats(); st.Hits != 3 || st.Misses != 0 {
		t.Fatalf("client stats %+v", st)
	}
}

// TestRefillWaitsForTakesToSettle: after a take the filler makes nothing
// until Config.Settle has passed (here an hour: nothing within the test),
// so a transfer that has just taken memory keeps the node's cores; with no
// settle it refills at once.
func TestRefillWaitsForTakesToSettle(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, tc := range []struct {
		name   string
		settle time.Duration
		refill bool
	}{{"an hour", time.Hour, false}, {"none", -1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			sock, _, _ := serve(t, Config{Budget: 16 << 20, Settle: tc.settle})
			c := Open(sock, nil, nil)
			defer c.Close()
			connected(t, c)
			waitReady(t, c, 16<<20) // the first fill: nothing taken yet
			fd, _, err := c.Take(context.Background(), 16<<20)
			require.NoError(t, err)
			unix.Close(fd)
			if tc.refill {
				waitReady(t, c, 16<<20)
				return
			}
			time.Sleep(200 * time.Millisecond) // a refill would have begun; none may finish
			st, err := c.ServerStats(context.Background())
			require.NoError(t, err)
			assert.Zero(t, st.Ready, "refilled before the takes settled")
		})
	}
}

// TestHostSocketPath: one socket per host in a runtime directory; names
// unfit for a file name, or long, hashed (stable, distinct).
func TestHostSocketPath(t *testing.T) {
	long := strings.Repeat("n", 40)
	cases := []struct{ host, want string }{
		{"", "/run/tl/nodepool.sock"},
		{"node-1.rack2", "/run/tl/nodepool.node-1.rack2.sock"},
		{"a/b", ""},
		{"..", ""},
		{long, ""},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		got := HostSocketPath("/run/tl", tc.host)
		if tc.want != "" {
			assert.Equal(t, tc.want, got, tc.host)
		} else {
			assert.Regexp(t, `^/run/tl/nodepool\.h[0-9a-f]{16}\.sock$`, got, tc.host)
		}
		assert.Equal(t, got, HostSocketPath("/run/tl", tc.host), "stable")
		assert.False(t, seen[got], "distinct: %q", tc.host)
		seen[got] = true
	}
}
