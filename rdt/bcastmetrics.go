package rdt

// bcastMetrics counts a finished broadcast's readers in the runtime's
// broadcast metrics (bcast.Metrics) and warns when some did not get it.
func (r *Runtime) bcastMetrics(res *BroadcastResult) {
	for _, rr := range res.Readers {
		if rr.Err == nil {
			r.bmet.Readers.WithLabelValues("ok").Inc()
			r.bmet.Bytes.Add(float64(res.Bytes))
		} else {
			r.bmet.Readers.WithLabelValues("failed").Inc()
		}
	}
	if n := len(res.Readers) - res.OK(); n > 0 {
		r.log.Warn("broadcast incomplete", "readers", len(res.Readers), "failed", n, "err", res.Err())
	}
}
