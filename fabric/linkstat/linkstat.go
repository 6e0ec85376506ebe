package linkstat

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Mode says where a link's figures come from.
type Mode string

const (
	// ModeEBPF: a sock_ops program on the connections' cgroup records RTT,
	// retransmissions and bytes as the kernel updates them.
	ModeEBPF Mode = "ebpf"
	// ModeTCPInfo: the monitor polls getsockopt(TCP_INFO) on each tracked
	// connection. Same figures, read at each refresh.
	ModeTCPInfo Mode = "tcp_info"
)

// ErrClosed is returned by Track after Close.
var ErrClosed = fmt.Errorf("linkstat: monitor closed: %w", net.ErrClosed)

// Config configures a Monitor. The zero value tries eBPF on this process's
// cgroup v2 and falls back to TCP_INFO polling, refreshes every second, and
// calls a link degraded when its smoothed RTT is over 4x its minimum and
// 5 ms above it, or when over 1% of the segments sent in the last interval
// (and at least 3) were retransmitted.
type Config struct {
	// ForceTCPInfo skips eBPF and polls TCP_INFO.
	ForceTCPInfo bool
	// Cgroup is the cgroup v2 directory the sock_ops program attaches to.
	// Every TCP socket created in that cgroup (and below) gets its
	// callbacks, so it must hold this process alone: a configured cgroup
	// that holds others is refused (TCP_INFO polling, and a warning).
	// Default: this process's own cgroup v2 when it holds the process
	// alone (a container, a systemd unit); else a child cgroup
	// <own>/tensorlane-<pid> made for it, into which the process moves
	// (with a warning; it moves back, and the child goes, when the last
	// monitor closes); else TCP_INFO polling.
	Cgroup string
	// MountCgroup2, if set, is where to mount a cgroup v2 hierarchy when
	// the system mounts none (cgroup v1 only). Default: do not mount.
	MountCgroup2 string
	// Interval between refreshes (reads and health checks). Default 1 s.
	Interval time.Duration
	// MapEntries bounds the eBPF map (an LRU keyed by socket cookie).
	// Default 16384.
	MapEntries int
	// RTTFactor and RTTSlack: degraded when RTT > RTTFactor x min RTT and
	// RTT - min RTT > RTTSlack. Defaults 4 and 5 ms.
	RTTFactor float64
	RTTSlack  time.Duration
	// MaxRTT: degraded above this RTT; 0 disables the absolute bound.
	MaxRTT time.Duration
	// RetransRatio and MinRetrans: degraded when, in the last interval, at
	// least MinRetrans segments were retransmitted and they are more than
	// RetransRatio of the data segments sent. Defaults 0.01 and 3.
	RetransRatio float64
	MinRetrans   uint32
	// OnHealth is called (from the refresh goroutine, or the caller of
	// Refresh) when a link turns degraded or recovers. Transports use it to
	// pause a rail or stream and resume it later.
	OnHealth func(LinkStats)
	// Registerer receives the link metrics. Default: none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.MapEntries <= 0 {
		c.MapEntries = 16384
	}
	if c.RTTFactor <= 0 {
		c.RTTFactor = 4
	}
	if c.RTTSlack <= 0 {
		c.RTTSlack = 5 * time.Millisecond
	}
	if c.RetransRatio <= 0 {
		c.RetransRatio = 0.01
	}
	if c.MinRetrans == 0 {
		c.MinRetrans = 3
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Labels name a tracked connection in snapshots and metrics.
type Labels struct {
	Link      string `json:"link"`      // e.g. "h0/mlx5_0->h1/mlx5_0" or "tcp stream 2"
	Transport string `json:"transport"` // e.g. "tcp", "rdma"
	Peer      string `json:"peer"`
}

// LinkStats is one connection's figures at the last refresh.
type LinkStats struct {
	ID uint64 `json:"id"`
	Labels
	Local  string `json:"local"`
	Remote string `json:"remote"`
	Source Mode   `json:"source"`
	// RTT is the kernel's smoothed round-trip time, MinRTT its windowed
	// minimum.
	RTT    time.Duration `json:"rtt_ns"`
	MinRTT time.Duration `json:"min_rtt_ns"`
	// Retransmits counts segments retransmitted over the connection's
	// life (tcpi_total_retrans).
	Retransmits   uint64 `json:"retransmits"`
	BytesSent     uint64 `json:"bytes_sent"` // acknowledged by the peer
	BytesReceived uint64 `json:"bytes_received"`
	SegmentsOut   uint64 `json:"segments_out"` // data segments
	SegmentsIn    uint64 `json:"segments_in"`
	Cwnd          uint32 `json:"cwnd"`
	State         string `json:"state"`
	Degraded      bool   `json:"degraded"`
	Reason        string `json:"reason,omitempty"`
	// RecentRetransmits and RecentSegments are the deltas of the last
	// interval the health check looked at.
	RecentRetransmits uint64    `json:"recent_retransmits"`
	RecentSegments    uint64    `json:"recent_segments"`
	Updated           time.Time `json:"updated"`
}

// Monitor collects per-connection link telemetry for the connections it
// tracks and reports their health.
type Monitor struct {
	cfg     Config
	log     *slog.Logger
	mode    Mode
	cgroup  string
	how     string // how the cgroup was chosen
	release func() // gives back the cgroup (soleCgroup)
	bpf     *bpfCollector
	health  prometheus.Counter

	mu      sync.Mutex
	links   map[uint64]*Link
	nextID  uint64
	closed  bool
	subs    map[uint64]func(LinkStats) // Subscribe's, keyed by nextSub
	nextSub uint64

	refreshMu sync.Mutex // one refresh at a time
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Link is a tracked connection.
type Link struct {
	m      *Monitor
	id     uint64
	labels Labels
	raw    syscall.RawConn
	cookie uint64
	local  string
	remote string

	// guarded by m.mu
	stats    LinkStats
	prev     sample
	havePrev bool
	warned   bool
}

// New starts a monitor: eBPF if permitted (and not disabled), TCP_INFO
// polling otherwise. It logs which mode it runs in, and why eBPF was not
// used.
func New(cfg Config) (*Monitor, error) {
	c := cfg.withDefaults()
	m := &Monitor{cfg: c, log: c.Logger, mode: ModeTCPInfo, links: map[uint64]*Link{}, stop: make(chan struct{})}
	m.health = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_link_health_changes_total", Help: "Links that turned degraded or recovered.",
	})
	if c.ForceTCPInfo {
		m.log.Info("linkstat: polling TCP_INFO (eBPF disabled by configuration)", "mode", ModeTCPInfo, "interval", c.Interval)
	} else if err := m.tryBPF(); err != nil {
		m.log.Warn("linkstat: eBPF sock_ops not available, falling back to polling TCP_INFO", "mode", ModeTCPInfo, "err", err, "interval", c.Interval)
	} else if m.how != "" && strings.HasPrefix(m.how, "child") {
		m.log.Warn("linkstat: eBPF sock_ops attached to a child cgroup this process moved into, so that it hooks this process's sockets alone",
			"mode", ModeEBPF, "cgroup", m.cgroup, "why", m.how, "interval", c.Interval)
	} else {
		m.log.Info("linkstat: eBPF sock_ops attached", "mode", ModeEBPF, "cgroup", m.cgroup, "why", m.how, "interval", c.Interval)
	}
	if c.Registerer != nil {
		if err := c.Registerer.Register(collector{m}); err != nil {
			m.closeBPF()
			return nil, err
		}
		if err := c.Registerer.Register(m.health); err != nil {
			m.closeBPF()
			return nil, err
		}
	}
	m.wg.Add(1)
	go m.loop()
	return m, nil
}

func (m *Monitor) tryBPF() error {
	cg, how, release, err := soleCgroup(m.cfg.Cgroup, m.cfg.MountCgroup2)
	if err != nil {
		return err
	}
	b, err := attachBPF(cg, m.cfg.MapEntries)
	if err != nil {
		release()
		return err
	}
	m.bpf, m.cgroup, m.how, m.release, m.mode = b, cg, how, sync.OnceFunc(release), ModeEBPF
	return nil
}

// Mode says how the monitor collects figures.
func (m *Monitor) Mode() Mode { return m.mode }

// Cgroup is the cgroup v2 directory the eBPF program is attached to ("" in
// TCP_INFO mode).
func (m *Monitor) Cgroup() string { return m.cgroup }

// Track starts collecting figures for a TCP connection. In eBPF mode the
// connection must have been established after New and inside the
// monitored cgroup; otherwise its figures come from TCP_INFO, and a log
// line says so.
func (m *Monitor) Track(conn net.Conn, labels Labels) (*Link, error) {
	raw, err := rawOf(conn)
	if err != nil {
		return nil, err
	}
	l := &Link{m: m, labels: labels, raw: raw, local: addrString(conn.LocalAddr()), remote: addrString(conn.RemoteAddr())}
	if m.bpf != nil {
		if l.cookie, err = cookieOf(raw); err != nil {
			return nil, fmt.Errorf("linkstat: SO_COOKIE: %w", err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.nextID++
	l.id = m.nextID
	l.stats = LinkStats{ID: l.id, Labels: labels, Local: l.local, Remote: l.remote, Source: m.mode}
	m.links[l.id] = l
	return l, nil
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// Stats returns the link's figures at the last refresh.
func (l *Link) Stats() LinkStats {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.stats
}

// Untrack stops collecting figures for the link. It is idempotent; closed
// connections are untracked at the next refresh anyway.
func (l *Link) Untrack() {
	l.m.mu.Lock()
	_, ok := l.m.links[l.id]
	delete(l.m.links, l.id)
	l.m.mu.Unlock()
	if ok && l.m.bpf != nil {
		l.m.bpf.forget(l.cookie)
	}
}

func (m *Monitor) loop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Refresh()
		}
	}
}

// Refresh reads every tracked link now and re-evaluates its health (the
// monitor also does so every Interval).
func (m *Monitor) Refresh() {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	m.mu.Lock()
	links := make([]*Link, 0, len(m.links))
	for _, l := range m.links {
		links = append(links, l)
	}
	m.mu.Unlock()
	var changed []LinkStats
	now := time.Now()
	for _, l := range links {
		s, src, err := m.read(l)
		if err != nil {
			// The connection is gone (closed fd): stop tracking it.
			m.log.Debug("linkstat: untracking closed connection", "link", l.labels.Link, "err", err)
			l.Untrack()
			continue
		}
		m.mu.Lock()
		was := l.stats.Degraded
		l.stats = m.evaluate(l, s, src, now)
		if l.stats.Degraded != was {
			changed = append(changed, l.stats)
		}
		m.mu.Unlock()
	}
	for _, st := range changed {
		m.health.Inc()
		if st.Degraded {
			m.log.Warn("linkstat: link degraded", "link", st.Link, "transport", st.Transport, "peer", st.Peer, "reason", st.Reason, "rtt", st.RTT, "min_rtt", st.MinRTT, "retransmits", st.Retransmits)
		} else {
			m.log.Info("linkstat: link recovered", "link", st.Link, "transport", st.Transport, "peer", st.Peer, "rtt", st.RTT)
		}
		if m.cfg.OnHealth != nil {
			m.cfg.OnHealth(st)
		}
		m.mu.Lock()
		subs := make([]func(LinkStats), 0, len(m.subs))
		for _, fn := range m.subs {
			subs = append(subs, fn)
		}
		m.mu.Unlock()
		for _, fn := range subs {
			fn(st)
		}
	}
}

// Subscribe adds fn to the functions called on every health transition,
// like Config.OnHealth (after it, from the same goroutine), so that several
// users of one monitor (runtimes sharing a process's eBPF program) each
// hear about their links. cancel removes fn; it is idempotent.
func (m *Monitor) Subscribe(fn func(LinkStats)) (cancel func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.subs == nil {
		m.subs = map[uint64]func(LinkStats){}
	}
	m.nextSub++
	id := m.nextSub
	m.subs[id] = fn
	return func() {
		m.mu.Lock()
		delete(m.subs, id)
		m.mu.Unlock()
	}
}

// Interval is the time between the monitor's refreshes.
func (m *Monitor) Interval() time.Duration { return m.cfg.Interval }

// read returns the link's current sample: from the eBPF map, or TCP_INFO
// when the monitor polls, or when the map has nothing for the socket.
func (m *Monitor) read(l *Link) (sample, Mode, error) {
	if m.bpf == nil {
		s, err := tcpInfo(l.raw)
		return s, ModeTCPInfo, err
	}
	// No syscall on the socket in eBPF mode beyond this liveness check: the
	// figures come from the map.
	if err := l.raw.Control(func(uintptr) {}); err != nil {
		return sample{}, "", err
	}
	if s, ok := m.bpf.lookup(l.cookie); ok {
		return s, ModeEBPF, nil
	}
	ti, err := tcpInfo(l.raw)
	if err != nil {
		return sample{}, "", err
	}
	m.mu.Lock()
	warn := !l.warned
	l.warned = true
	m.mu.Unlock()
	if warn {
		m.log.Warn("linkstat: no eBPF sample for connection (established before the program attached, or outside its cgroup); polling TCP_INFO for it",
			"link", l.labels.Link, "local", l.local, "remote", l.remote, "cgroup", m.cgroup)
	}
	return ti, ModeTCPInfo, nil
}

// evaluate turns a sample into stats and applies the health rules. Called
// with m.mu held.
func (m *Monitor) evaluate(l *Link, s sample, src Mode, now time.Time) LinkStats {
	st := LinkStats{
		ID: l.id, Labels: l.labels, Local: l.local, Remote: l.remote, Source: src,
		RTT: time.Duration(s.srtt8>>3) * time.Microsecond, MinRTT: time.Duration(s.rttMin) * time.Microsecond,
		Retransmits: uint64(s.totalRetrans), BytesSent: s.bytesAcked, BytesReceived: s.bytesReceived,
		SegmentsOut: uint64(s.segsOut), SegmentsIn: uint64(s.segsIn), Cwnd: s.cwnd, State: stateName(s.state), Updated: now,
	}
	if l.havePrev {
		if s.totalRetrans >= l.prev.totalRetrans {
			st.RecentRetransmits = uint64(s.totalRetrans - l.prev.totalRetrans)
		}
		if s.segsOut >= l.prev.segsOut {
			st.RecentSegments = uint64(s.segsOut - l.prev.segsOut)
		}
	}
	l.prev, l.havePrev = s, true
	c := m.cfg
	switch {
	case c.MaxRTT > 0 && st.RTT > c.MaxRTT:
		st.Degraded, st.Reason = true, fmt.Sprintf("rtt %v above the %v bound", st.RTT, c.MaxRTT)
	case st.MinRTT > 0 && float64(st.RTT) > c.RTTFactor*float64(st.MinRTT) && st.RTT-st.MinRTT > c.RTTSlack:
		st.Degraded, st.Reason = true, fmt.Sprintf("rtt %v is %.0fx the minimum %v", st.RTT, float64(st.RTT)/float64(st.MinRTT), st.MinRTT)
	case st.RecentRetransmits >= uint64(c.MinRetrans) && st.RecentSegments > 0 &&
		float64(st.RecentRetransmits) > c.RetransRatio*float64(st.RecentSegments):
		st.Degraded, st.Reason = true, fmt.Sprintf("%d of %d segments retransmitted in the last interval", st.RecentRetransmits, st.RecentSegments)
	}
	return st
}

// Snapshot refreshes every link and returns their figures, ordered by ID.
func (m *Monitor) Snapshot() []LinkStats {
	m.Refresh()
	return m.Last()
}

// Last returns the figures of the last refresh without reading the kernel.
func (m *Monitor) Last() []LinkStats {
	m.mu.Lock()
	out := make([]LinkStats, 0, len(m.links))
	for _, l := range m.links {
		out = append(out, l.stats)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Degraded returns the links degraded at the last refresh.
func (m *Monitor) Degraded() []LinkStats {
	var out []LinkStats
	for _, s := range m.Last() {
		if s.Degraded {
			out = append(out, s)
		}
	}
	return out
}

// Close stops the refresh goroutine and detaches the eBPF program. It is
// idempotent; Track fails afterwards.
func (m *Monitor) Close() error {
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.links = map[uint64]*Link{}
		m.mu.Unlock()
		close(m.stop)
		m.wg.Wait()
		m.closeErr = m.closeBPF()
	})
	return m.closeErr
}

func (m *Monitor) closeBPF() error {
	if m.bpf == nil {
		return nil
	}
	err := m.bpf.close()
	if err != nil {
		err = errors.Join(errors.New("linkstat: detach eBPF"), err)
	}
	m.release()
	return err
}

// collector exports the last refresh's figures at scrape time.
type collector struct{ m *Monitor }

var (
	linkLabels   = []string{"link", "transport", "peer", "id", "source"}
	rttDesc      = prometheus.NewDesc("tensorlane_link_rtt_seconds", "Smoothed round-trip time of a tracked connection.", linkLabels, nil)
	minRTTDesc   = prometheus.NewDesc("tensorlane_link_min_rtt_seconds", "Minimum round-trip time the kernel observed on a tracked connection.", linkLabels, nil)
	retransDesc  = prometheus.NewDesc("tensorlane_link_retransmits_total", "Segments retransmitted on a tracked connection.", linkLabels, nil)
	sentDesc     = prometheus.NewDesc("tensorlane_link_sent_bytes_total", "Bytes sent and acknowledged on a tracked connection.", linkLabels, nil)
	recvDesc     = prometheus.NewDesc("tensorlane_link_received_bytes_total", "Bytes received on a tracked connection.", linkLabels, nil)
	cwndDesc     = prometheus.NewDesc("tensorlane_link_cwnd_segments", "Congestion window of a tracked connection.", linkLabels, nil)
	degradedDesc = prometheus.NewDesc("tensorlane_link_degraded", "1 when a tracked connection is degraded (RTT or retransmissions).", linkLabels, nil)
	modeDesc     = prometheus.NewDesc("tensorlane_linkstat_mode", "How link figures are collected (1 for the mode in use).", []string{"mode"}, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{rttDesc, minRTTDesc, retransDesc, sentDesc, recvDesc, cwndDesc, degradedDesc, modeDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, 1, string(c.m.mode))
	for _, s := range c.m.Last() {
		lv := []string{s.Link, s.Transport, s.Peer, strconv.FormatUint(s.ID, 10), string(s.Source)}
		deg := 0.0
		if s.Degraded {
			deg = 1
		}
		ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, s.RTT.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(minRTTDesc, prometheus.GaugeValue, s.MinRTT.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(retransDesc, prometheus.CounterValue, float64(s.Retransmits), lv...)
		ch <- prometheus.MustNewConstMetric(sentDesc, prometheus.CounterValue, float64(s.BytesSent), lv...)
		ch <- prometheus.MustNewConstMetric(recvDesc, prometheus.CounterValue, float64(s.BytesReceived), lv...)
		ch <- prometheus.MustNewConstMetric(cwndDesc, prometheus.GaugeValue, float64(s.Cwnd), lv...)
		ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, deg, lv...)
	}
}
