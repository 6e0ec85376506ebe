package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/demo"
	"github.com/tensorlane/tensorlane/dashboard"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
)

type dashboardOptions struct {
	preset     string
	hosts      int
	addr       string
	demo       bool
	size       string
	tensors    int
	readers    int
	interval   time.Duration
	placements string
	verbose    bool
	pprof      bool
	allowHosts []string
}

func init() {
	o := dashboardOptions{}
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve the dashboard (topology, transfers, objects, memory, metrics) over a simulated cluster",
		Long: `dashboard builds the demo's simulated cluster (one runtime per host of a preset, in
this process, talking over loopback), serves the dashboard page, its JSON API,
/metrics and (with --pprof) /debug/pprof, and with --demo-traffic runs the demo's weight-sync
steps in a loop so the page has transfers to show. Devices are simulated
(memfd-backed arenas, real copies) and the page says so. Stops on SIGINT/SIGTERM.
Every request needs the access token in the URL it prints (the page keeps it in
a cookie) or an Authorization: Bearer header; host names other than IP
addresses, localhost and --allow-host are refused.

  tensorlane dashboard --preset dgx-h100 --hosts 2 --demo-traffic --addr 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDashboard(ctx, cmd.OutOrStdout(), o, nil)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.preset, "preset", "dgx-h100", "topology preset of every host")
	f.IntVar(&o.hosts, "hosts", 2, "number of simulated hosts (one runtime each)")
	f.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen address of the dashboard")
	f.BoolVar(&o.demo, "demo-traffic", false, "run the demo's weight-sync steps in a loop")
	f.StringVar(&o.size, "size", "16MiB", "size of each demo tensor")
	f.IntVar(&o.tensors, "tensors", 4, "number of demo tensors")
	f.IntVar(&o.readers, "readers", 4, "number of demo reader actors, spread over GPUs and hosts")
	f.DurationVar(&o.interval, "interval", time.Second, "pause between demo steps")
	f.StringVar(&o.placements, "placements", "", "JSON file to show as placements (e.g. the output of tensorlane place --json); default: the demo actors' devices")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log runtime events to stderr")
	f.BoolVar(&o.pprof, "pprof", false, "also serve /debug/pprof (goroutine dumps, profiles) to clients with the token")
	f.StringSliceVar(&o.allowHosts, "allow-host", nil, "host names clients may use besides IP addresses and localhost (DNS-rebinding guard)")
	rootCmd.AddCommand(cmd)
}

// demoPlacement is one actor's device, shown as the demo's placements.
type demoPlacement struct {
	Actor  string `json:"actor"`
	Host   string `json:"host"`
	Device string `json:"device"`
}

// runDashboard serves until ctx ends. ready, if set, gets the page's URL once
// the server listens.
func runDashboard(ctx context.Context, out io.Writer, o dashboardOptions, ready func(url string)) error {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if o.verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	var placements any
	if o.placements != "" {
		b, err := os.ReadFile(o.placements)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &placements); err != nil {
			return fmt.Errorf("dashboard: --placements %s: %w", o.placements, err)
		}
	}
	// One link monitor for every runtime of the demo: their data
	// connections (tcp streams, rdma rails) show in the page's Links table
	// and /metrics, and a rail the owner's end sees degraded is paused on
	// the reader's.
	linkReg := prometheus.NewRegistry()
	mon, err := linkstat.New(linkstat.Config{Registerer: linkReg, Logger: logger})
	if err != nil {
		return err
	}
	defer mon.Close()
	cfg, err := demoOptions{preset: o.preset, hosts: o.hosts, readers: o.readers, tensors: o.tensors, steps: 1, size: o.size}.config()
	if err != nil {
		return err
	}
	cfg.Logger, cfg.LinkMonitor = logger, mon
	rig, err := demo.NewRig(ctx, cfg)
	if err != nil {
		return err
	}
	defer rig.Close()
	if placements == nil {
		pl := []demoPlacement{{"trainer", rig.Runtimes()[0].HostID(), rig.Trainer().Devices()[0].String()}}
		for _, r := range rig.Readers() {
			pl = append(pl, demoPlacement{r.Actor.Name(), r.Host, r.Device.String()})
		}
		placements = pl
	}
	h, err := dashboard.New(dashboard.Config{Runtimes: rig.Runtimes(), Placements: func() any { return placements },
		Links: func() any { return mon.Last() }, Gatherers: []prometheus.Gatherer{linkReg}, Logger: logger,
		Pprof: o.pprof, AllowedHosts: o.allowHosts})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("dashboard: listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("dashboard: serve", "err", err)
		}
	}()
	// The token is in the URL the person opens; the page then holds it in
	// a cookie. Scrapers send it as a bearer token.
	url := "http://" + ln.Addr().String() + "/?token=" + h.Token()
	fmt.Fprintf(out, "tensorlane dashboard: %s\n(%d simulated %s hosts in this process; demo traffic %v; Ctrl-C stops;\n scrape /metrics with Authorization: Bearer %s)\n", url, o.hosts, o.preset, o.demo, h.Token())
	if ready != nil {
		ready(url)
	}

	loopCtx, stopLoop := context.WithCancel(ctx)
	if o.demo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rig.Loop(loopCtx, o.interval, logger)
		}()
	}
	<-ctx.Done()
	stopLoop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	wg.Wait()
	fmt.Fprintln(out, "tensorlane dashboard: stopped")
	return err
}
