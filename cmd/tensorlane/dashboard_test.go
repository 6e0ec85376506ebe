package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/internal/testhelp"
)

// dashboardBackground are goroutines libp2p keeps for the life of the
// process, started by the first runtime of any test.
var dashboardBackground = testhelp.Libp2pBackground()

// syncBuffer is an io.Writer safe for the server goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDashboard runs the dashboard command with demo traffic on a free
// port and returns its URL; cleanup stops it and checks it stopped cleanly.
func startDashboard(t *testing.T) string {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, append(dashboardBackground, opt)...) })
	ctx, cancel := context.WithCancel(context.Background())
	urlc := make(chan string, 1)
	errc := make(chan error, 1)
	var out syncBuffer
	go func() {
		errc <- runDashboard(ctx, &out, dashboardOptions{preset: "dgx-h100", hosts: 2, addr: "127.0.0.1:0", demo: true,
			size: "1MiB", tensors: 2, readers: 4, interval: 200 * time.Millisecond}, func(u string) { urlc <- u })
	}()
	var url string
	select {
	case url = <-urlc:
	case err := <-errc:
		t.Fatalf("dashboard did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("dashboard did not start in 30 s")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			assert.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Error("dashboard did not stop within 20 s of its context ending")
		}
		assert.Contains(t, out.String(), "tensorlane dashboard: stopped")
	})
	assert.Contains(t, out.String(), url)
	return url
}

func TestDashboardAPI(t *testing.T) {
	full := startDashboard(t)
	url, token, ok := strings.Cut(full, "?token=")
	require.True(t, ok, "the printed URL carries the access token: %s", full)
	client := &http.Client{Timeout: 10 * time.Second}
	authGet := func(path string) (*http.Response, error) {
		req, err := http.NewRequest("GET", url+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		return client.Do(req)
	}
	// Without the token nothing is served.
	resp, err := client.Get(url + "api/objects")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	getJSON := func(path string, v any) {
		resp, err := authGet(path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}
	var x struct {
		Recent []struct {
			Path, Reader string
			Error        string
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for getJSON("api/transfers", &x); len(x.Recent) < 8 && time.Now().Before(deadline); getJSON("api/transfers", &x) {
		time.Sleep(50 * time.Millisecond) // the demo loop paces its steps
	}
	require.GreaterOrEqual(t, len(x.Recent), 8, "one demo step is 8 transfers")
	paths := map[string]bool{}
	for _, r := range x.Recent {
		assert.Empty(t, r.Error)
		paths[r.Path] = true
	}
	assert.True(t, paths["p2p"] && (paths["tcp"] || paths["rdma"]), "demo traffic takes the NVLink and a network path: %v", paths)
	// The demo's runtimes share a link monitor: their rails show as links.
	var links []struct {
		Link, Transport string
		BytesReceived   uint64 `json:"bytes_received"`
	}
	for getJSON("api/links", &links); len(links) == 0 && time.Now().Before(deadline); getJSON("api/links", &links) {
		time.Sleep(100 * time.Millisecond) // the monitor refreshes every second
	}
	require.NotEmpty(t, links, "the demo's data connections show as links")
	got := map[string]bool{}
	for _, l := range links {
		got[l.Transport] = true
	}
	assert.True(t, got["rdma"] || got["tcp"], "links of the network paths: %+v", links)
	var pl []demoPlacement
	getJSON("api/placements", &pl)
	assert.Len(t, pl, 5, "trainer and four readers")
	resp, err = authGet("metrics")
	require.NoError(t, err)
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Regexp(t, `tensorlane_transfers_total\{host="h1",result="ok",transport="(tcp|rdma)"\}`, string(m))
	assert.Contains(t, string(m), "tensorlane_linkstat_mode")
	assert.Contains(t, string(m), "tensorlane_link_rtt_seconds")
}

func TestDashboardBadFlags(t *testing.T) {
	var out bytes.Buffer
	assert.Error(t, runDashboard(context.Background(), &out, dashboardOptions{preset: "nope", hosts: 1, addr: "127.0.0.1:0", size: "1MiB", tensors: 1, readers: 1}, nil))
	assert.Error(t, runDashboard(context.Background(), &out, dashboardOptions{preset: "dgx-h100", hosts: 1, addr: "bad addr", size: "1MiB", tensors: 1, readers: 1}, nil))
	assert.Error(t, runDashboard(context.Background(), &out, dashboardOptions{preset: "dgx-h100", hosts: 1, addr: "127.0.0.1:0", size: "1MiB", tensors: 1, readers: 1, placements: "/nonexistent.json"}, nil))
	// A zero is refused, not read as the demo's default (and the server
	// never starts).
	assert.ErrorContains(t, runDashboard(context.Background(), &out, dashboardOptions{preset: "dgx-h100", hosts: 0, addr: "127.0.0.1:0", size: "1MiB", tensors: 1, readers: 1}, nil), "must be at least 1")
}

// findBrowser returns a Chromium-family browser, or "" when there is none.
func findBrowser() string {
	if p := os.Getenv("TENSORLANE_CHROMIUM"); p != "" {
		return p
	}
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

func artifactsDir(t *testing.T) string {
	dir := os.Getenv("TENSORLANE_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "tensorlane-artifacts")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// TestDashboardBrowser loads the page in headless Chromium: the picture
// shows the preset's 16 GPUs and a transfer of the demo traffic appears.
func TestDashboardBrowser(t *testing.T) {
	browser := findBrowser()
	if browser == "" {
		t.Skip("no Chromium found (install Debian's chromium, as .ci/run does, or set TENSORLANE_CHROMIUM)")
	}
	url := startDashboard(t)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000), // a common laptop width: the page must fit it
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`svg#topology g.device.gpu`)),
	))
	gpus, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('svg#topology g.device.gpu').length`))
	require.NoError(t, err)
	assert.Equal(t, 16, gpus, "dgx-h100 x2 has 16 GPUs in the picture")
	simulated, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!document.querySelector('#simulated').hidden && document.querySelectorAll('svg#topology g.device.simulated').length == 16`))
	require.NoError(t, err)
	assert.True(t, simulated, "simulated devices are labelled")

	// A transfer of the demo traffic appears in the table, and the overlay
	// draws it on the picture.
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll('#recent tbody tr.transfer').length >= 8`, chromedp.WithPollingTimeout(30*time.Second)))
	require.NoError(t, err)
	firstPath, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#recent tbody tr.transfer').dataset.path`))
	require.NoError(t, err)
	assert.Contains(t, []string{"p2p", "tcp", "rdma"}, firstPath)
	recentText, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#recent tbody`)))
	require.NoError(t, err)
	assert.Contains(t, recentText, "reader-")
	assert.Contains(t, recentText, "h1/gpu:1", "a cross-host reader of the demo appears")
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll('#overlay path.xfer').length > 0`, chromedp.WithPollingTimeout(10*time.Second)))
	if err != nil {
		status, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#status`)))
		t.Fatalf("no transfer arrows drawn on the picture (page status: %s): %v", status, err)
	}
	// What a person sees (issue 19.9): the page fits the window, the
	// throughput chart draws a line per path that moved bytes, the flat
	// transfer list stays short, and arrows mark the recent flows.
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](`document.querySelectorAll('#throughput polyline.series').length > 0`, chromedp.WithPollingTimeout(15*time.Second)))
	require.NoError(t, err, "a throughput series")
	peak, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`[...document.querySelectorAll('#throughput polyline.series')].some(p => p.getAttribute('points').split(' ').some(xy => +xy.split(',')[1] < 200))`))
	require.NoError(t, err)
	assert.True(t, peak, "some series rises above zero")
	legend, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#tput-legend`)))
	require.NoError(t, err)
	assert.Regexp(t, `(p2p|rdma|tcp) [0-9.e-]+ GB/s \(5 s mean\)`, legend)
	width, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
	require.NoError(t, err)
	assert.LessOrEqual(t, width, 1400, "no horizontal scrolling at 1400 px")
	shown, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#recent tbody tr').length`))
	require.NoError(t, err)
	assert.LessOrEqual(t, shown, 10, "the recent list shows the newest few, the rest folded")
	side, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const a = document.querySelector('#topology-section').getBoundingClientRect(), b = document.querySelector('#throughput-section').getBoundingClientRect(); return b.left >= a.right - 1 && b.top < a.bottom; })()`))
	require.NoError(t, err)
	assert.True(t, side, "the chart sits beside the picture at 1400 px")
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)

	path := filepath.Join(artifactsDir(t), "dashboard.png")
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(shot))
	cancelBrowser()
	cancelAlloc()
}
