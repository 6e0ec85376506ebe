// Package dashboard serves what operators need to check that tensorlane sees
// the cluster correctly and that transfers take the paths they should: a web
// page (the topology drawn as SVG with device memory in use, live and recent
// transfers with their path, size, rate, fallbacks and errors, the object
// table, link telemetry and placements), the JSON API behind it
// (/api/topology, /api/topology.svg, /api/transfers, /api/objects,
// /api/memory, /api/links, /api/placements, /api/info), Prometheus metrics
// at /metrics (every runtime's registry, each series labelled with its
// host, plus Go and process metrics) and, when Config.Pprof is set, pprof at
// /debug/pprof.
//
// It shows the object table and what moves where, so it is not public: every
// request presents the handler's token (a bearer header, or the cookie that
// opening the printed URL with ?token= sets), and a Host header other than an
// IP literal, localhost or Config.AllowedHosts is refused (DNS rebinding).
//
// Everything the page needs is embedded: it works with no network access.
// The Handler is an ordinary http.Handler, so a worker mounts it in its own
// server; `tensorlane dashboard` serves it over a demo workload. Simulated
// devices are labelled as such on the page and in the picture.
package dashboard
