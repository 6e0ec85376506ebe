package dashboard

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
)

const testToken = "0123456789abcdef0123456789abcdef"

// Who may read the dashboard (issue 29, item 14): the token is required,
// names other than this server's are refused before it, pprof is opt-in.
func TestAccess(t *testing.T) {
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	h, err := New(Config{Cluster: cl, Token: testToken, AllowedHosts: []string{"gpu-box.lab"}})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":"):]

	do := func(path, host string, hdr map[string]string) *http.Response {
		req, err := http.NewRequest("GET", srv.URL+path, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	bearer := map[string]string{"Authorization": "Bearer " + testToken}
	cases := []struct {
		name, path, host string
		hdr              map[string]string
		want             int
	}{
		{"no token", "/api/objects", "", nil, http.StatusUnauthorized},
		{"wrong token", "/api/objects", "", map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"bearer", "/api/objects", "", bearer, http.StatusOK},
		{"metrics need it too", "/metrics", "", nil, http.StatusUnauthorized},
		{"token in the URL", "/api/info?token=" + testToken, "", nil, http.StatusOK},
		{"cookie", "/api/objects", "", map[string]string{"Cookie": CookieName + "=" + testToken}, http.StatusOK},
		{"localhost by name", "/api/objects", "localhost" + port, bearer, http.StatusOK},
		{"allowed name", "/api/objects", "gpu-box.lab" + port, bearer, http.StatusOK},
		{"rebinding name, even with the token", "/api/objects", "evil.example" + port, bearer, http.StatusMisdirectedRequest},
		{"pprof off by default", "/debug/pprof/", "", bearer, http.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, do(c.path, c.host, c.hdr).StatusCode)
		})
	}

	// The URL token leaves an HttpOnly, SameSite=Strict cookie behind.
	resp := do("/?token="+testToken, "", nil)
	var c *http.Cookie
	for _, k := range resp.Cookies() {
		if k.Name == CookieName {
			c = k
		}
	}
	require.NotNil(t, c)
	assert.True(t, c.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
}

func TestDefaultTokenIsRandom(t *testing.T) {
	cl, err := topology.Preset("dgx-h100", 1)
	require.NoError(t, err)
	a, err := New(Config{Cluster: cl})
	require.NoError(t, err)
	b, err := New(Config{Cluster: cl})
	require.NoError(t, err)
	assert.Len(t, a.Token(), 32)
	assert.NotEqual(t, a.Token(), b.Token())
}
