package rdt

// bcastMetrics counts a finished broadcast's readers in the runtime's
// broadcast metrics (bcast.Metrics) and warns when some did not get it.
func (r *Runtime) bcastMetrics(res *BroadcastResult) {
	m := r.bcast.Metrics()
	for _, rr := range res.Readers {
		if rr.Err == nil {
			m.Readers.WithLabelValues("ok").Inc()
			m.Bytes.Add(float64(res.Bytes))
		} else {
			m.Readers.WithLabelValues("failed").Inc()
		}
	}
	if n := len(res.Readers) - res.OK(); n > 0 {
		r.log.Warn("broadcast incomplete", "readers", len(res.Readers), "failed", n, "err", res.Err())
	}
}
