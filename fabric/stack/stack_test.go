package stack

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// held is a buffer the source hands out pinned: the transport's Release
// must not free the object. Export passes through, so shm can map it.
type held struct{ tensor.Buffer }

func (held) Release() error  { return nil }
func (b held) Bytes() []byte { p, _ := tensor.BytesOf(b.Buffer); return p }
func (b held) Export(a tensor.Access) (tensor.Handle, error) {
	return b.Buffer.(tensor.Exportable).Export(a)
}

// owner is one simulated runtime's device memory with one object in it.
type owner struct {
	mem   *tensor.SimMemory
	obj   tensor.Buffer
	data  []byte
	token []byte
}

func newOwner(t *testing.T, size int64) *owner {
	t.Helper()
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(0), 4*size)
	require.NoError(t, err)
	t.Cleanup(func() { mem.Close() })
	obj, err := mem.Alloc(context.Background(), size)
	require.NoError(t, err)
	o := &owner{mem: mem, obj: obj, token: []byte("token")}
	o.data, _ = tensor.BytesOf(obj)
	for i := range o.data {
		o.data[i] = byte(i*31 + i>>11)
	}
	return o
}

func (o *owner) Open(_ context.Context, c fabric.Claim) (tensor.Buffer, error) {
	if !bytes.Equal(c.Token, o.token) {
		return nil, fabric.ErrUnauthorized
	}
	return held{o.obj}, nil
}

func cluster(t *testing.T) *topology.Cluster {
	t.Helper()
	cl, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	return cl
}

func start(t *testing.T, cfg Config, n Node) *Stack {
	t.Helper()
	if n.Identity == nil {
		n.Identity, _ = testhelp.Key(t)
	}
	cfg.IgnoreEnv = true
	s, err := Start(context.Background(), cfg, n)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func names(ts []fabric.Transport) []string {
	var out []string
	for _, tr := range ts {
		out = append(out, tr.Name())
	}
	slices.Sort(out)
	return out
}

// TestServed: what a stack runs, publishes and lists follows its Config
// and the Node's security settings.
func TestServed(t *testing.T) {
	cl := cluster(t)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound })
	for _, c := range []struct {
		name    string
		cfg     Config
		encrypt bool
		served  []string
	}{
		{"defaults", Config{}, false, []string{fabric.Local, fabric.P2P, fabric.SHM, fabric.RDMA, fabric.TCP}},
		{"no shm", Config{DisableSHM: true}, false, []string{fabric.Local, fabric.P2P, fabric.RDMA, fabric.TCP}},
		{"no rdma", Config{DisableRDMA: true}, false, []string{fabric.Local, fabric.P2P, fabric.SHM, fabric.TCP}},
		{"encrypted data turns rdma off", Config{}, true, []string{fabric.Local, fabric.P2P, fabric.SHM, fabric.TCP}},
		{"unknown provider leaves rdma off", Config{RDMAProviderKind: "bogus"}, false, []string{fabric.Local, fabric.P2P, fabric.SHM, fabric.TCP}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := start(t, c.cfg, Node{Security: fabric.Security{EncryptData: c.encrypt}, Cluster: cl, Host: "h0", Process: "p", Source: src})
			assert.Equal(t, c.served, s.Served())
			addrs := s.Addrs()
			for _, name := range []string{fabric.SHM, fabric.RDMA, fabric.TCP} {
				_, ok := addrs[name]
				assert.Equal(t, slices.Contains(c.served, name), ok, "address of %s", name)
			}
			assert.Equal(t, addrs[fabric.TCP], s.TCPAddr())
			want := []string{fabric.Local, fabric.P2P, fabric.TCP}
			if slices.Contains(c.served, fabric.SHM) {
				want = append(want, fabric.P2P, fabric.SHM) // cross-process p2p and shm
			}
			if slices.Contains(c.served, fabric.RDMA) {
				want = append(want, fabric.RDMA)
			}
			slices.Sort(want)
			assert.Equal(t, want, names(s.Transports()))
			assert.Nil(t, s.LinkMonitor(), "link telemetry is off by default")
			assert.Nil(t, s.Links())
			require.NoError(t, s.Close())
			require.NoError(t, s.Close(), "Close is idempotent")
		})
	}
}

// TestRead: a reader's stack moves an object out of an owner's over each
// cross-process path, through the addresses the owner's stack publishes.
func TestRead(t *testing.T) {
	const size = 3<<20 + 123
	cl := cluster(t)
	o := newOwner(t, size)
	ownerKey, ownerID := testhelp.Key(t)
	a := start(t, Config{}, Node{Security: fabric.Security{Identity: ownerKey}, Cluster: cl, Host: "h0", Process: "owner", Source: o})
	local := start(t, Config{}, Node{Cluster: cl, Host: "h0", Process: "reader", Source: o})
	far := start(t, Config{}, Node{Cluster: cl, Host: "h1", Process: "far", Source: o})
	remote := fabric.Remote{Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer: ownerID.String(), Addrs: a.Addrs(), Claim: fabric.Claim{Token: o.token}, Length: size}
	for _, c := range []struct {
		reader    *Stack
		transport string
	}{{local, fabric.SHM}, {local, fabric.P2P}, {far, fabric.RDMA}, {far, fabric.TCP}} {
		t.Run(c.transport, func(t *testing.T) {
			var tr fabric.Transport
			for _, x := range c.reader.Transports() {
				if _, ok := x.Reach(remote.Endpoint, fabric.Endpoint{Process: "reader", Host: "h0", Device: tensor.GPUDevice(1)}); x.Name() == c.transport && (ok || c.transport != fabric.P2P) {
					tr = x
				}
			}
			require.NotNil(t, tr, "the reader runs %s", c.transport)
			mem, err := tensor.NewSimMemory(tensor.GPUDevice(1), 2*size)
			require.NoError(t, err)
			defer mem.Close()
			dst, err := mem.Alloc(context.Background(), size)
			require.NoError(t, err)
			defer dst.Release()
			st, err := tr.Read(context.Background(), remote, dst)
			require.NoError(t, err)
			assert.Equal(t, c.transport, st.Transport)
			got, _ := tensor.BytesOf(dst)
			assert.True(t, bytes.Equal(o.data, got), "the bytes arrived intact")

			bad := remote
			bad.Claim.Token = []byte("forged")
			_, err = tr.Read(context.Background(), bad, dst)
			assert.Error(t, err, "a forged claim is refused")
		})
	}
}

// TestLinkTelemetry: with LinkTelemetry the stack makes, wires and closes
// its own monitor, and dials tcp through it.
func TestLinkTelemetry(t *testing.T) {
	cl := cluster(t)
	o := newOwner(t, 1<<20)
	ownerKey, ownerID := testhelp.Key(t)
	a := start(t, Config{}, Node{Security: fabric.Security{Identity: ownerKey}, Cluster: cl, Host: "h0", Process: "owner", Source: o})
	b := start(t, Config{LinkTelemetry: true, DisableRDMA: true}, Node{Cluster: cl, Host: "h1", Process: "far", Source: o,
		Registerer: prometheus.NewRegistry()})
	require.NotNil(t, b.LinkMonitor())
	var tcp fabric.Transport
	for _, x := range b.Transports() {
		if x.Name() == fabric.TCP {
			tcp = x
		}
	}
	mem, err := tensor.NewSimMemory(tensor.GPUDevice(1), 2<<20)
	require.NoError(t, err)
	defer mem.Close()
	dst, _ := mem.Alloc(context.Background(), 1<<20)
	defer dst.Release()
	_, err = tcp.Read(context.Background(), fabric.Remote{Endpoint: fabric.Endpoint{Process: "owner", Host: "h0", Device: tensor.GPUDevice(0)},
		Peer: ownerID.String(), Addrs: a.Addrs(), Claim: fabric.Claim{Token: o.token}, Length: 1 << 20}, dst)
	require.NoError(t, err)
	b.LinkMonitor().Refresh()
	links := b.Links()
	require.NotEmpty(t, links, "the tcp streams are tracked")
	for _, l := range links {
		assert.Equal(t, fabric.TCP, l.Transport)
	}
	require.NoError(t, b.Close())
}

// TestConfigErrors: a Node without what the stack needs, and a bad
// TENSORLANE_TRANSPORTS, fail Start with an error that names them.
func TestConfigErrors(t *testing.T) {
	cl := cluster(t)
	key, _ := testhelp.Key(t)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound })
	ok := Node{Security: fabric.Security{Identity: key}, Cluster: cl, Host: "h0", Source: src}
	for _, c := range []struct {
		name string
		node func(n *Node)
		want string
	}{
		{"no identity", func(n *Node) { n.Identity = nil }, "Identity"},
		{"no cluster", func(n *Node) { n.Cluster = nil }, "Cluster"},
		{"no source", func(n *Node) { n.Source = nil }, "Source"},
		{"short cluster key", func(n *Node) { n.ClusterKey = []byte("short") }, "32 bytes"},
		{"bad authorize is kept", func(n *Node) { n.AllowPeer = func(peer.ID) error { return errors.New("no") } }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := ok
			c.node(&n)
			s, err := Start(context.Background(), Config{IgnoreEnv: true}, n)
			if c.want == "" {
				require.NoError(t, err)
				require.NoError(t, s.Close())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	t.Setenv(EnvTransports, "tcp,bogus")
	_, err := Start(context.Background(), Config{}, ok)
	require.Error(t, err)
	assert.Contains(t, err.Error(), EnvTransports)
}

// TestEnv: TENSORLANE_TRANSPORTS and TENSORLANE_RDMA_PROVIDER apply unless
// IgnoreEnv.
func TestEnv(t *testing.T) {
	cl := cluster(t)
	key, _ := testhelp.Key(t)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound })
	t.Setenv(EnvTransports, "^rdma")
	t.Setenv(EnvRDMAProvider, "bogus")
	s, err := Start(context.Background(), Config{Deny: []string{fabric.SHM}}, Node{Security: fabric.Security{Identity: key}, Cluster: cl, Host: "h0", Source: src})
	require.NoError(t, err)
	assert.Equal(t, []string{fabric.SHM, fabric.RDMA}, s.Config().Deny)
	assert.Equal(t, "bogus", s.Config().RDMAProviderKind)
	assert.NotContains(t, s.Served(), fabric.RDMA, "the bogus provider left rdma off")
	require.NoError(t, s.Close())

	s, err = Start(context.Background(), Config{IgnoreEnv: true}, Node{Security: fabric.Security{Identity: key}, Cluster: cl, Host: "h0", Source: src})
	require.NoError(t, err)
	assert.Empty(t, s.Config().Deny)
	assert.Contains(t, s.Served(), fabric.RDMA)
	require.NoError(t, s.Close())
}

// TestWildcardNotAdvertised: a stack listening on a wildcard never puts the
// wildcard into the addresses refs carry (issue 29 item 9: a reader on
// another host dialled [::]:port, i.e. itself); a specific address is
// advertised as it is.
func TestWildcardNotAdvertised(t *testing.T) {
	cl := cluster(t)
	src := fabric.SourceFunc(func(context.Context, fabric.Claim) (tensor.Buffer, error) { return nil, fabric.ErrObjectNotFound })
	for _, addr := range []string{"0.0.0.0:0", "[::]:0"} {
		t.Run(addr, func(t *testing.T) {
			s := start(t, Config{DataAddr: addr}, Node{Cluster: cl, Host: "h0", Process: "p", Source: src})
			addrs := s.Addrs()
			host, port, err := net.SplitHostPort(addrs[fabric.TCP])
			require.NoError(t, err)
			ip := net.ParseIP(host)
			require.NotNil(t, ip, "tcp address %q", addrs[fabric.TCP])
			assert.False(t, ip.IsUnspecified(), "tcp address %q is a wildcard", addrs[fabric.TCP])
			assert.NotEqual(t, "0", port)
			assert.Equal(t, addrs[fabric.TCP], s.TCPAddr())
			rails, err := rdma.ParseAddrs(addrs[fabric.RDMA])
			require.NoError(t, err)
			require.NotEmpty(t, rails)
			for _, r := range rails {
				h, _, err := net.SplitHostPort(r.Addr)
				require.NoError(t, err)
				assert.False(t, net.ParseIP(h).IsUnspecified(), "rail %s address %q is a wildcard", r.NIC, r.Addr)
			}
		})
	}
	s := start(t, Config{DataAddr: "127.0.0.1:0"}, Node{Cluster: cl, Host: "h0", Process: "p", Source: src})
	host, _, err := net.SplitHostPort(s.Addrs()[fabric.TCP])
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host, "a specific address is advertised as it is")
}
