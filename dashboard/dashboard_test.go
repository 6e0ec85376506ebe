package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testhelp.Isolated(m),
		goleak.IgnoreAnyFunction("github.com/libp2p/go-libp2p/p2p/transport/tcpreuse.(*ConnMgr).run"),
		goleak.IgnoreTopFunction("github.com/libp2p/go-libp2p/p2p/net/nat.DiscoverNAT"),
		goleak.IgnoreTopFunction("github.com/ipfs/go-log/v2/writer.(*MirrorWriter).logRoutine"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}

// twoHosts starts a runtime per host of a two-host dgx-h100 cluster and
// makes one same-host (p2p) and one cross-host (tcp) transfer.
func twoHosts(t *testing.T) []*rdt.Runtime {
	t.Helper()
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	var rts []*rdt.Runtime
	for _, h := range cl.HostIDs() {
		r, err := rdt.New(ctx, rdt.Config{Cluster: cl, Host: h, IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 64 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { r.Shutdown(context.Background()) })
		rts = append(rts, r)
	}
	owner, err := rts[0].Spawn("trainer", rdt.WithDevices(tensor.GPUDevice(0)))
	require.NoError(t, err)
	near, err := rts[0].Spawn("near", rdt.WithDevices(tensor.GPUDevice(1)))
	require.NoError(t, err)
	far, err := rts[1].Spawn("far", rdt.WithDevices(tensor.GPUDevice(0)))
	require.NoError(t, err)
	mem, err := rts[0].Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	x, err := tensor.Alloc(ctx, mem, tensor.Float32, 1024)
	require.NoError(t, err)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	for _, a := range []*rdt.Actor{near, far} {
		got, err := a.Get(ctx, ref, a.Devices()[0])
		require.NoError(t, err)
		got.Release()
	}
	return rts
}

// get fetches path with the token that testToken's handlers use.
func get(t *testing.T, srv *httptest.Server, path string) (string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, b)
	return string(b), resp.Header
}

func TestHandler(t *testing.T) {
	rts := twoHosts(t)
	h, err := New(Config{Runtimes: rts, Placements: func() any { return map[string]string{"trainer": "h0/gpu:0"} }, Token: testToken, Pprof: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	page, _ := get(t, srv, "/")
	assert.Contains(t, page, `<script src="app.js">`)
	js, hdr := get(t, srv, "/app.js")
	assert.Contains(t, hdr.Get("Content-Type"), "javascript")
	assert.NotContains(t, js+page, "http://", "no CDN: everything is embedded")

	svg, hdr := get(t, srv, "/api/topology.svg")
	assert.Equal(t, "image/svg+xml", hdr.Get("Content-Type"))
	assert.Equal(t, 16, strings.Count(svg, `<g class="device gpu simulated"`), "16 simulated GPUs")
	assert.Equal(t, 16, strings.Count(svg, `<g class="nic"`))
	assert.Equal(t, 2, strings.Count(svg, `<g class="link nvlink"`))
	assert.Contains(t, svg, "SIMULATED")
	assert.Contains(t, svg, `data-ep="h1/gpu:7"`)
	assert.Equal(t, 16, strings.Count(svg, `data-backend="sim"`), "each GPU says which back-end holds its memory")
	assert.Contains(t, svg, "all-to-all, 8 devices (28 links)")

	var topo Topology
	body, _ := get(t, srv, "/api/topology")
	require.NoError(t, json.Unmarshal([]byte(body), &topo))
	assert.Len(t, topo.Cluster.Hosts, 2)
	assert.NotEmpty(t, topo.Domains)

	var xf Transfers
	body, _ = get(t, srv, "/api/transfers")
	require.NoError(t, json.Unmarshal([]byte(body), &xf))
	require.Len(t, xf.Recent, 2)
	paths := map[string]string{}
	for _, r := range xf.Recent {
		paths[r.Host] = r.Path
	}
	assert.Equal(t, "p2p", paths["h0"], "same host: NVLink")
	assert.Contains(t, []string{"tcp", "rdma"}, paths["h1"], "other host: a network path")
	assert.Empty(t, xf.Live)

	// Throughput per path, per second, over the last minute: each transfer
	// counted once however often the page polls.
	var tp Throughput
	for range 2 {
		body, _ = get(t, srv, "/api/throughput")
		tp = Throughput{}
		require.NoError(t, json.Unmarshal([]byte(body), &tp))
	}
	assert.Equal(t, 60, tp.Seconds)
	total := map[string]float64{}
	for p, v := range tp.GBps {
		require.Len(t, v, 60, p)
		for _, x := range v {
			total[p] += x
		}
	}
	assert.InDelta(t, 4096/1e9, total["p2p"], 1e-12, "one 4 KiB p2p transfer, counted once: %v", tp.GBps)
	assert.InDelta(t, 4096/1e9, total[paths["h1"]], 1e-12)

	var objs []rdt.ObjectInfo
	body, _ = get(t, srv, "/api/objects")
	require.NoError(t, json.Unmarshal([]byte(body), &objs))
	require.Len(t, objs, 1)
	assert.Equal(t, "trainer", objs[0].Owner)

	var mem []Memory
	body, _ = get(t, srv, "/api/memory")
	require.NoError(t, json.Unmarshal([]byte(body), &mem))
	assert.Len(t, mem, 18)
	for _, m := range mem {
		want := map[bool]string{true: "host", false: "sim"}[m.Device == "cpu:0"]
		assert.Equal(t, want, m.Backend, "%s/%s: which back-end holds the memory", m.Host, m.Device)
	}

	body, _ = get(t, srv, "/api/placements")
	assert.JSONEq(t, `{"trainer":"h0/gpu:0"}`, body)
	body, _ = get(t, srv, "/api/links")
	assert.Equal(t, "null", strings.TrimSpace(body))

	metrics, _ := get(t, srv, "/metrics")
	for _, want := range []string{
		`tensorlane_transfers_total{host="h0",result="ok",transport="p2p"} 1`,
		`tensorlane_transfers_total{host="h1",result="ok",transport="` + paths["h1"] + `"} 1`,
		`tensorlane_transfer_bytes_total{host="h1",transport="` + paths["h1"] + `"} 4096`,
		`tensorlane_device_memory_used_bytes{device="gpu:0",host="h0",simulated="true"}`,
		`tensorlane_transfer_seconds_bucket{host="h0",transport="p2p"`,
		`go_goroutines`,
	} {
		assert.Contains(t, metrics, want)
	}
	pp, _ := get(t, srv, "/debug/pprof/")
	assert.Contains(t, pp, "goroutine")
}

func TestNewErrors(t *testing.T) {
	_, err := New(Config{})
	assert.ErrorIs(t, err, ErrNoCluster)
	cl, err := topology.Preset("gb200-nvl72", 2)
	require.NoError(t, err)
	h, err := New(Config{Cluster: cl, Token: testToken})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	svg, _ := get(t, srv, "/api/topology.svg")
	assert.Contains(t, svg, "<svg")
	body, _ := get(t, srv, "/api/transfers")
	assert.JSONEq(t, `{"live":[],"recent":[],"errors":0,"fallbacks":0,"degraded":0}`, body)
}

// Every preset draws without panicking and names each device once.
func TestSVGPresets(t *testing.T) {
	for _, name := range topology.Presets() {
		t.Run(name, func(t *testing.T) {
			cl, err := topology.Preset(name, 2)
			require.NoError(t, err)
			var b strings.Builder
			writeSVG(&b, cl, nil)
			n := 0
			for _, h := range cl.Hosts {
				n += len(h.Devices)
			}
			assert.Equal(t, n, strings.Count(b.String(), `<g class="device `), name)
			assert.True(t, strings.HasSuffix(b.String(), "</svg>"))
		})
	}
}

// Link telemetry from fabric/linkstat shows on the page's Links table and
// in /metrics through Config.Links and Config.Gatherers.
func TestLinks(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := linkstat.New(linkstat.Config{ForceTCPInfo: true, Registerer: reg, Interval: time.Hour})
	require.NoError(t, err)
	defer m.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_, err = m.Track(conn, linkstat.Labels{Link: "h0->h1 stream 0", Transport: "tcp", Peer: "h1"})
	require.NoError(t, err)
	_, err = conn.Write(make([]byte, 64<<10))
	require.NoError(t, err)

	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	h, err := New(Config{Cluster: cl, Links: func() any { return m.Snapshot() }, Gatherers: []prometheus.Gatherer{reg}, Token: testToken})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	var links []linkstat.LinkStats
	body, _ := get(t, srv, "/api/links")
	require.NoError(t, json.Unmarshal([]byte(body), &links))
	require.Len(t, links, 1)
	assert.Equal(t, "h0->h1 stream 0", links[0].Link)
	assert.Equal(t, linkstat.ModeTCPInfo, links[0].Source)
	metrics, _ := get(t, srv, "/metrics")
	assert.Contains(t, metrics, `tensorlane_linkstat_mode{mode="tcp_info"} 1`)
	assert.Contains(t, metrics, `tensorlane_link_rtt_seconds{id="1",link="h0->h1 stream 0",peer="h1",source="tcp_info",transport="tcp"}`)
	conn.Close()
	<-done
}
