package schema

// The environment variables fields fall back on.
const (
	EnvTransports    = "TENSORLANE_TRANSPORTS"
	EnvRDMAProvider  = "TENSORLANE_RDMA_PROVIDER"
	EnvClusterKey    = "TENSORLANE_CLUSTER_KEY"
	EnvDeviceBackend = "TENSORLANE_DEVICE_BACKEND"
	EnvDevices       = "TENSORLANE_DEVICES"
	EnvRuntimeDir    = "TENSORLANE_RUNTIME_DIR"
	EnvSlabs         = "TENSORLANE_SLABS"
	EnvPoolBytes     = "TENSORLANE_POOL_BYTES"
	EnvNodePool      = "TENSORLANE_NODE_POOL_BYTES"
)

const all = Go | JSON | Worker

// fields is the one definition of every configuration field, in the order
// of the docs: where the runtime lives, how it is reached, who may talk to
// it, its memory, its timers, then layer-specific settings.
var fields = []Field{
	// The cluster and this runtime's place in it.
	{Name: "preset", Type: String, Default: "dgx-h100", Layers: JSON | Worker,
		Doc: "Topology preset the cluster is built from (tensorlane topo); in Go, rdt.Config.Cluster."},
	{Name: "hosts", Type: Int, Default: "1", WorkerDefault: "3", Layers: JSON | Worker,
		Doc: "Number of hosts in the preset cluster."},
	{Name: "discover", Type: Bool, Layers: JSON,
		Doc: "Build the topology of this machine from sysfs instead of a preset (its host ID is the host name unless host is set)."},
	{Name: "host", Type: String, Default: "the cluster's first host (h0)", Layers: all,
		Doc: "The topology host this runtime claims; runtimes claiming one host use the same-host paths (shm, p2p) between them."},

	// Where it listens and which transports it runs.
	{Name: "listen_addrs", Type: Strings, Default: "/ip4/127.0.0.1/tcp/0", Layers: all,
		Doc:     "libp2p multiaddrs of the control channel.",
		Aliases: []Alias{{Name: "listen", Layer: JSON | Worker}}},
	{Name: "data_addr", Type: String, Default: "127.0.0.1:0", Layers: all,
		Doc: "The tcp data listener's address."},
	{Name: "allow_transports", Type: Strings, Default: "every registered transport", Env: EnvTransports, Layers: all,
		Doc:     "Transports this runtime may use, by registry name (local, p2p, shm, rdma, tcp); the environment narrows them further.",
		Aliases: []Alias{{Name: "allow", Layer: JSON}, {Name: "transports", Layer: Worker}}},
	{Name: "deny_transports", Type: Strings, Env: EnvTransports, Layers: all,
		Doc:     "Transports this runtime must not use, by registry name.",
		Aliases: []Alias{{Name: "deny", Layer: JSON}}},
	{Name: "disable_rdma", Type: Bool, Layers: all,
		Doc:     "Turn the rdma path off (tcp serves other hosts).",
		Aliases: []Alias{{Name: "no-rdma", Layer: Worker}}},
	{Name: "rdma_provider", Type: String, Default: "soft", Env: EnvRDMAProvider, Layers: all,
		Doc: "The rdma provider: soft (a software provider over TCP, one rail per RDMA NIC) or ofi (libfabric; a build with -tags ofi)."},
	{Name: "rdma_ip", Type: String, Default: "loopback", Layers: Worker,
		Doc: "Address the simulated RDMA NICs' rails listen on (the host's address in a network namespace)."},

	// Identity and security: one name per concept at every layer.
	{Name: "identity_file", Type: String, Layers: JSON | Worker,
		Doc: "libp2p private key file, created if missing, so a restarted runtime keeps its peer ID (default: a new identity)."},
	{Name: "cluster_key", Type: HexKey, Env: EnvClusterKey, Layers: Go | JSON,
		Doc: "32-byte key of a private cluster: the control channel is a libp2p private network with it and every data connection proves it (a pre-shared key in the handshake); it is also the trust scope of shm slab grants. In the C ABI and Python: cluster_key_file if set, else the environment variable."},
	{Name: "cluster_key_file", Type: String, Layers: JSON | Worker,
		Doc: "File holding the cluster key (32 bytes, raw or as 64 hex digits)."},
	{Name: "allow_peers", Type: Strings, Layers: all,
		Doc: "Admit only these peer IDs (and the runtime itself) on the control channel and on data connections; empty admits every member."},
	{Name: "encrypt_data", Type: Bool, Layers: all,
		Doc:     "Encrypt data connections (AES-256-GCM, keys from an X25519 exchange in the authenticated handshake) and refuse unencrypted readers; turns rdma off (it does not encrypt). The control channel is always encrypted.",
		Aliases: []Alias{{Name: "encrypt", Layer: Worker}}},

	// Devices and memory.
	{Name: "device_backend", Type: String, Default: "auto", Env: EnvDeviceBackend, Layers: all,
		Doc: "Memory of the host's accelerators (tensor/backend): auto (a discovered host's devices on their driver when usable, else simulated), sim, real (an unusable driver is an error), or one back-end for every device: cuda, hip. In the C ABI, setting it gives the runtime the host's accelerators (like sim_devices)."},
	{Name: "visible_devices", Type: Ints, Default: "all", Env: EnvDevices, Layers: Go | JSON,
		Doc: "Indices of the host's accelerators this runtime claims; empty claims none. Without it, TENSORLANE_DEVICES, else CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES."},
	{Name: "sim_devices", Type: Bool, Layers: JSON,
		Doc: "Give the runtime the host's accelerators (simulated unless device_backend or its variable says otherwise) besides host memory; off, a C ABI runtime has host memory only."},
	{Name: "device_memory", Type: ByteSize, Default: "the topology's device size", WorkerDefault: "1GiB", Layers: all,
		Doc: "Capacity of each simulated device arena."},
	{Name: "host_memory", Type: ByteSize, Default: "unbounded", Layers: all,
		Doc: "Cap on host memory allocations."},
	{Name: "runtime_dir", Type: String, Default: "$XDG_RUNTIME_DIR/tensorlane", Env: EnvRuntimeDir, Layers: Go | JSON,
		Doc: "Directory of the device claim locks (one flock'ed file per cluster, host and device)."},

	// Timers.
	{Name: "transfer_timeout", Type: Duration, Default: "2m", Layers: all,
		Doc:     "Bound on a Get whose context (or call) has no deadline.",
		Aliases: []Alias{{Name: "transfer_timeout_ms", Layer: JSON, Millis: true}}},
	{Name: "stall_timeout", Type: Duration, Default: "30s", Layers: all,
		Doc: "Fail a transfer that makes no progress for this long."},
	{Name: "lease_renew", Type: Duration, Default: "5s", Layers: all,
		Doc: "How often a reader renews its leases on the refs it holds."},
	{Name: "lease_expiry", Type: Duration, Default: "3 × lease_renew", Layers: all,
		Doc: "How long an owner keeps a lease that was not renewed (a dead reader's); must exceed lease_renew."},
	{Name: "heartbeat_interval", Type: Duration, Default: "1s", Layers: all,
		Doc: "How often a watched peer is pinged, and how long one ping may take."},
	{Name: "heartbeat_misses", Type: Int, Default: "3", Layers: all,
		Doc: "Missed pings in a row after which a peer is declared dead."},

	// The rest of the runtime.
	{Name: "inbox_size", Type: Int, Default: "1024", Layers: Go | JSON,
		Doc: "Each actor's message queue length."},
	{Name: "ignore_env", Type: Bool, Layers: Go | JSON,
		Doc: "Read no environment variable: the fields' variables above are ignored."},
	{Name: "log_level", Type: String, Default: "off", Layers: JSON,
		Doc: "debug, info, warn or error; logs go to stderr (in Go, rdt.Config.Logger)."},
	{Name: "verbose", Type: Bool, Layers: Worker,
		Doc: "Debug logs on stderr (the worker logs at info otherwise)."},

	// The C ABI's host memory.
	{Name: "lazy_staging", Type: Bool, Layers: JSON,
		Doc: "Copy a foreign Put into shareable memory only when the first same-host reader asks (which then waits for the copy). By default, when the runtime serves shm, the copy starts in the background at Put, so a same-host reader finds it made or under way; the cost is that copy's memory also for objects only network readers read."},
	{Name: "stage_pool_bytes", Type: ByteSize, Default: "256MiB", Layers: JSON,
		Doc: "Bound on the staging pool (pre-populated allocations for foreign Puts' staging copies); negative turns it off.", Negative: true},
	{Name: "slabs", Type: OptBool, Default: "off", Env: EnvSlabs, Layers: JSON,
		Doc: "Carve shareable host memory (allocations, Get destinations, foreign Puts' staging copies) from large memfd slabs that a same-host reader maps once for all their objects, reusing freed memory with its pages populated. A reader that may read one object of a slab can read the others, so it needs a cluster key, which bounds who may read (docs/security-shm-grants.md). A view of a slab object holds its range until released."},
	{Name: "pool_bytes", Type: ByteSize, Env: EnvPoolBytes, Layers: JSON,
		Doc: "Memory made resident before the runtime starts: with slabs, a slab that Gets and tensorlane.empty allocate from for the runtime's life (like Ray's object store memory); without, memory held for the first large host allocation (usually the first Get's destination), so a cold Get pays no page population."},
	{Name: "slab_bytes", Type: ByteSize, Default: "64MiB", Layers: JSON,
		Doc: "Size of one slab; larger allocations get a slab of their own."},
	{Name: "node_pool_bytes", Type: ByteSize, Default: "512MiB", Env: EnvNodePool, Layers: JSON, Negative: true,
		Doc: "With slabs, the budget of the node's warm pool: populated memory a helper process that outlives the node's runtimes holds and hands to them for new slabs (tensor/nodepool), so a cold transfer pays no page population; set by the runtime that starts the helper; negative turns the pool off. Without a helper (node_pool_helper empty and none running) or with the pool empty, a runtime makes its own slabs, counted in stats (node_pool)."},
	{Name: "node_pool_helper", Type: Strings, Layers: JSON,
		Doc: "The command that starts the node pool's helper when none runs (it must detach; the Python package fills in its own); empty: the runtime uses a helper only if one runs."},
}
