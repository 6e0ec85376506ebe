package shm

import "github.com/prometheus/client_golang/prometheus"

// collector reports a client's mapping cache at scrape time. It is
// registered only on the registry the runtime passes (Config.Registerer),
// never on the global one, so several runtimes in a process do not clash.
type collector struct{ c *Client }

var (
	mappingsDesc = prometheus.NewDesc("tensorlane_shm_mappings", "Owner object regions mapped by the shm/p2p mapping cache.", nil, nil)
	mappedDesc   = prometheus.NewDesc("tensorlane_shm_mapped_bytes", "Bytes of owner objects mapped by the shm/p2p mapping cache.", nil, nil)
	eventsDesc   = prometheus.NewDesc("tensorlane_shm_mapping_events_total",
		"Mapping cache events by direction (pull: reads, object pages mapped read-only; push: writes, a sink's pages mapped writable): "+
			"mapped (a miss: descriptor received and mapped), hit (served by a cached mapping), revoked (owner refused the claim), evicted, purged (owner went away).",
		[]string{"event", "direction"}, nil)
	slabsDesc      = prometheus.NewDesc("tensorlane_shm_slabs", "Owner slabs (slab memory of one trust scope) mapped read-only by this reader.", nil, nil)
	slabBytesDesc  = prometheus.NewDesc("tensorlane_shm_slab_bytes", "Bytes of owner slabs mapped by this reader.", nil, nil)
	slabEventsDesc = prometheus.NewDesc("tensorlane_shm_slab_events_total",
		"Slab grants: mapped (a descriptor received and mapped: one mmap), reused (a descriptor received for a slab already mapped: no mmap), "+
			"hit (no descriptor needed), unmapped, announced (a descriptor the owner sent ahead of any read: prefetch), "+
			"prefetched (a prefetch of an owner's slabs finished), over_budget (a prefetch skipped: the slabs mapped fill its budget).",
		[]string{"event"}, nil)
	batchDesc = prometheus.NewDesc("tensorlane_shm_batch_events_total",
		"Batches (ReadBatch, WriteBatch): frames (one request and reply per owner and up to 256 objects or sinks), items, descriptors and the packets they came in, "+
			"one_by_one (items read or pushed singly because the owner refused batches).",
		[]string{"event"}, nil)
	prefetchBytesDesc = prometheus.NewDesc("tensorlane_shm_slab_prefetch_bytes_total",
		"Bytes of owners' slabs whose page tables this reader built in the background, ahead of its reads.", nil, nil)
	prefetchingDesc = prometheus.NewDesc("tensorlane_shm_slab_prefetches", "Slab prefetches in flight.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mappingsDesc
	ch <- mappedDesc
	ch <- eventsDesc
	ch <- slabsDesc
	ch <- slabBytesDesc
	ch <- slabEventsDesc
	ch <- batchDesc
	ch <- prefetchBytesDesc
	ch <- prefetchingDesc
}

func (k collector) Collect(ch chan<- prometheus.Metric) {
	s := k.c.cache.snapshot()
	ch <- prometheus.MustNewConstMetric(mappingsDesc, prometheus.GaugeValue, float64(s.Live))
	ch <- prometheus.MustNewConstMetric(mappedDesc, prometheus.GaugeValue, float64(s.Bytes))
	for _, d := range []struct {
		name string
		e    CacheEvents
	}{{"pull", s.Pull}, {"push", s.Push}} {
		for _, e := range []struct {
			name string
			n    int64
		}{{"mapped", d.e.Mapped}, {"hit", d.e.Hits}, {"revoked", d.e.Revoked}, {"evicted", d.e.Evicted}, {"purged", d.e.Purged}} {
			ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(e.n), e.name, d.name)
		}
	}
	sl := k.c.slabs.snapshot()
	ch <- prometheus.MustNewConstMetric(slabsDesc, prometheus.GaugeValue, float64(sl.Live))
	ch <- prometheus.MustNewConstMetric(slabBytesDesc, prometheus.GaugeValue, float64(sl.Bytes))
	for _, e := range []struct {
		name string
		n    int64
	}{{"mapped", sl.Mapped}, {"reused", sl.Reused}, {"hit", sl.Hits}, {"unmapped", sl.Unmapped},
		{"announced", sl.Announced}, {"prefetched", sl.Prefetches}, {"over_budget", sl.OverBudget}} {
		ch <- prometheus.MustNewConstMetric(slabEventsDesc, prometheus.CounterValue, float64(e.n), e.name)
	}
	b := k.c.BatchStats()
	for _, e := range []struct {
		name string
		n    int64
	}{{"frames", b.Frames}, {"items", b.Items}, {"descriptors", b.Descriptors}, {"packets", b.Packets}, {"one_by_one", b.OneByOne}} {
		ch <- prometheus.MustNewConstMetric(batchDesc, prometheus.CounterValue, float64(e.n), e.name)
	}
	ch <- prometheus.MustNewConstMetric(prefetchBytesDesc, prometheus.CounterValue, float64(sl.PrefetchedBytes))
	ch <- prometheus.MustNewConstMetric(prefetchingDesc, prometheus.GaugeValue, float64(sl.Prefetching))
}
