package dashboard

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

//go:embed static
var static embed.FS

// ErrNoCluster is returned by New when neither a cluster nor a runtime to
// take it from is configured.
var ErrNoCluster = errors.New("dashboard: no cluster to show (set Config.Cluster or Config.Runtimes)")

// Config configures the dashboard. Only Cluster or Runtimes is required;
// every other field may stay zero.
type Config struct {
	// Runtimes whose transfers, objects, device memory and metrics are
	// shown. They may belong to one process or be several simulated hosts.
	Runtimes []*rdt.Runtime
	// Cluster is the topology drawn. Default: the first runtime's cluster.
	Cluster *topology.Cluster
	// Placements, if set, is served as JSON at /api/placements and shown on
	// the page (for example sched results, or `tensorlane place --json`).
	Placements func() any
	// Links, if set, is served at /api/links and shown on the page (for
	// example a linkstat.Monitor's Snapshot).
	Links func() any
	// Gatherers are extra metric sources for /metrics. The runtimes'
	// registries, Go runtime and process metrics are always included.
	Gatherers []prometheus.Gatherer
	// Title heads the page. Default: "tensorlane · <cluster name>".
	Title string
	// RecentLimit bounds /api/transfers' recent list. Default 200.
	RecentLimit int
	Logger      *slog.Logger

	// Token is the access token every request must present (see
	// access.go). Default: a random one, read back with Handler.Token.
	Token string
	// NoAuth serves without a token: only for a handler mounted behind
	// your own authentication.
	NoAuth bool
	// AllowedHosts are the host names (besides IP literals and localhost)
	// clients may use to reach the dashboard, e.g. the machine's DNS name.
	AllowedHosts []string
	// Pprof also serves /debug/pprof (goroutine dumps, profiles) to
	// authorized clients. Default off.
	Pprof bool
}

// Handler serves the page, the JSON API, /metrics and, if enabled,
// /debug/pprof, to clients that present its token. Mount it at the root of
// a server (or under a prefix with http.StripPrefix).
type Handler struct {
	cfg     Config
	token   string
	mux     *http.ServeMux
	log     *slog.Logger
	process *prometheus.Registry
	started time.Time
	tput    throughputState // throughput.go
}

var _ http.Handler = (*Handler)(nil)

// New builds the dashboard handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Cluster == nil {
		for _, r := range cfg.Runtimes {
			if r != nil {
				cfg.Cluster = r.Cluster()
				break
			}
		}
	}
	if cfg.Cluster == nil {
		return nil, ErrNoCluster
	}
	if cfg.Title == "" {
		cfg.Title = "tensorlane · " + cfg.Cluster.Name
	}
	if cfg.RecentLimit <= 0 {
		cfg.RecentLimit = 200
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Token == "" {
		cfg.Token = newToken()
	}
	h := &Handler{cfg: cfg, token: cfg.Token, mux: http.NewServeMux(), log: cfg.Logger, process: prometheus.NewRegistry(), started: time.Now()}
	h.process.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	sub, _ := fs.Sub(static, "static")
	h.mux.Handle("/", http.FileServerFS(sub))
	h.mux.HandleFunc("GET /api/topology", h.topology)
	h.mux.HandleFunc("GET /api/topology.svg", h.topologySVG)
	h.mux.HandleFunc("GET /api/transfers", h.transfers)
	h.mux.HandleFunc("GET /api/throughput", h.throughput)
	h.mux.HandleFunc("GET /api/objects", h.objects)
	h.mux.HandleFunc("GET /api/memory", h.memory)
	h.mux.HandleFunc("GET /api/placements", h.placements)
	h.mux.HandleFunc("GET /api/links", h.links)
	h.mux.HandleFunc("GET /api/info", h.info)
	h.mux.Handle("GET /metrics", promhttp.HandlerFor(h.gatherer(), promhttp.HandlerOpts{ErrorLog: slogAdapter{h.log}, ErrorHandling: promhttp.ContinueOnError}))
	if cfg.Pprof {
		h.mux.HandleFunc("/debug/pprof/", pprof.Index)
		h.mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		h.mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		h.mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		h.mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return h, nil
}

func (h *Handler) writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	if err := enc.Encode(v); err != nil {
		h.log.Warn("dashboard: write response", "err", err)
	}
}

// Info is /api/info: what the page shows in its header.
type Info struct {
	Title     string    `json:"title"`
	Cluster   string    `json:"cluster"`
	Hosts     int       `json:"hosts"`
	Devices   int       `json:"devices"`
	Simulated bool      `json:"simulated"`
	Runtimes  []string  `json:"runtimes"` // the hosts the runtimes claim
	Started   time.Time `json:"started"`
	Pprof     bool      `json:"pprof"` // /debug/pprof is served
}

func (h *Handler) info(w http.ResponseWriter, _ *http.Request) {
	in := Info{Title: h.cfg.Title, Cluster: h.cfg.Cluster.Name, Started: h.started, Pprof: h.cfg.Pprof}
	for _, ho := range h.cfg.Cluster.Hosts {
		if ho == nil {
			continue
		}
		in.Hosts++
		in.Devices += len(ho.Devices)
		in.Simulated = in.Simulated || ho.Simulated
	}
	for _, r := range h.cfg.Runtimes {
		in.Runtimes = append(in.Runtimes, r.HostID())
	}
	h.writeJSON(w, in)
}

// Topology is /api/topology: the cluster model as topology encodes it, and
// its domains (NVLink domains, racks, slices...).
type Topology struct {
	Cluster *topology.Cluster `json:"cluster"`
	Domains []topology.Domain `json:"domains"`
	Colors  map[string]string `json:"colors"`
}

func (h *Handler) topology(w http.ResponseWriter, _ *http.Request) {
	h.writeJSON(w, Topology{Cluster: h.cfg.Cluster, Domains: h.cfg.Cluster.Domains(), Colors: LinkColors})
}

func (h *Handler) topologySVG(w http.ResponseWriter, _ *http.Request) {
	mem := map[string]memUse{}
	for _, r := range h.cfg.Runtimes {
		for _, s := range r.MemoryStats() {
			mem[r.HostID()+"/"+s.Device.String()] = memUse{used: s.Used, capacity: s.Capacity, backend: s.Backend}
		}
	}
	var buf bytes.Buffer
	writeSVG(&buf, h.cfg.Cluster, mem)
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

// Transfers is /api/transfers.
type Transfers struct {
	Live   []Transfer `json:"live"`
	Recent []Transfer `json:"recent"`
	// Totals over the recent window shown.
	Errors    int `json:"errors"`
	Fallbacks int `json:"fallbacks"`
	Degraded  int `json:"degraded"`
}

// Transfer is a transfer record with the host of the runtime that made it.
type Transfer struct {
	Host string `json:"host"`
	rdt.TransferRecord
}

func (h *Handler) transfers(w http.ResponseWriter, r *http.Request) {
	limit := h.cfg.RecentLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 && n < limit {
			limit = n
		}
	}
	out := Transfers{Live: []Transfer{}, Recent: []Transfer{}}
	for _, rt := range h.cfg.Runtimes {
		for _, t := range rt.LiveTransfers() {
			out.Live = append(out.Live, Transfer{rt.HostID(), t})
		}
		for _, t := range rt.RecentTransfers() {
			out.Recent = append(out.Recent, Transfer{rt.HostID(), t})
		}
	}
	sort.SliceStable(out.Live, func(i, j int) bool { return out.Live[i].Start.Before(out.Live[j].Start) })
	sort.SliceStable(out.Recent, func(i, j int) bool {
		return out.Recent[i].Start.Add(out.Recent[i].Duration).After(out.Recent[j].Start.Add(out.Recent[j].Duration))
	})
	if len(out.Recent) > limit {
		out.Recent = out.Recent[:limit]
	}
	for _, t := range out.Recent {
		if t.Error != "" {
			out.Errors++
		}
		if t.Fallback {
			out.Fallbacks++
		}
		if t.Degraded {
			out.Degraded++
		}
	}
	h.writeJSON(w, out)
}

func (h *Handler) objects(w http.ResponseWriter, _ *http.Request) {
	out := []rdt.ObjectInfo{}
	for _, rt := range h.cfg.Runtimes {
		out = append(out, rt.ObjectTable()...)
	}
	h.writeJSON(w, out)
}

// Memory is one device's memory in /api/memory.
type Memory struct {
	Host        string `json:"host"`
	Device      string `json:"device"`
	Simulated   bool   `json:"simulated"`
	Backend     string `json:"backend,omitempty"` // "sim", "cuda", "hip", "host"
	Capacity    int64  `json:"capacity"`
	Used        int64  `json:"used"`
	Free        int64  `json:"free"`
	LargestFree int64  `json:"largest_free"`
	Allocs      int    `json:"allocs"`
	Peak        int64  `json:"peak"`
}

func memoryOf(host string, s tensor.MemStats) Memory {
	return Memory{Host: host, Device: s.Device.String(), Simulated: s.Simulated, Backend: s.Backend, Capacity: s.Capacity, Used: s.Used,
		Free: s.Free, LargestFree: s.LargestFree, Allocs: s.Allocs, Peak: s.Peak}
}

func (h *Handler) memory(w http.ResponseWriter, _ *http.Request) {
	out := []Memory{}
	for _, rt := range h.cfg.Runtimes {
		for _, s := range rt.MemoryStats() {
			out = append(out, memoryOf(rt.HostID(), s))
		}
	}
	h.writeJSON(w, out)
}

func (h *Handler) placements(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Placements == nil {
		h.writeJSON(w, nil)
		return
	}
	h.writeJSON(w, h.cfg.Placements())
}

func (h *Handler) links(w http.ResponseWriter, _ *http.Request) {
	if h.cfg.Links == nil {
		h.writeJSON(w, nil)
		return
	}
	h.writeJSON(w, h.cfg.Links())
}

// gatherer merges the runtimes' registries. Several runtimes in one process
// register the same metric names on private registries, so each one's
// series get a host label (unless they carry one already) to stay distinct.
func (h *Handler) gatherer() prometheus.Gatherer {
	gs := prometheus.Gatherers{h.process}
	for _, rt := range h.cfg.Runtimes {
		if reg := rt.Registry(); reg != nil {
			gs = append(gs, hostLabeled{reg, rt.HostID()})
		}
	}
	return append(gs, h.cfg.Gatherers...)
}

type hostLabeled struct {
	g    prometheus.Gatherer
	host string
}

func (l hostLabeled) Gather() ([]*dto.MetricFamily, error) {
	fams, err := l.g.Gather()
	for _, f := range fams {
		for _, m := range f.Metric {
			has := false
			for _, lp := range m.Label {
				if lp.GetName() == "host" {
					has = true
				}
			}
			if !has {
				m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("host"), Value: proto.String(l.host)})
				sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
			}
		}
	}
	return fams, err
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Println(v ...any) { a.l.Warn("dashboard: metrics", "err", v) }
