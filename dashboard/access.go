package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"slices"
	"strings"
)

// Who may read the dashboard. It shows the object table, transfers, device
// memory and (when enabled) goroutine dumps, so it is not a public page:
//
//   - Every request needs the access token: an "Authorization: Bearer"
//     header (curl, Prometheus' bearer_token), or the session cookie that
//     opening the page's URL with ?token= sets (HttpOnly, SameSite=Strict,
//     so other sites cannot ride it).
//   - The Host header must be an IP literal, localhost, or one of
//     Config.AllowedHosts: a DNS-rebinding page (evil.example resolving to
//     127.0.0.1) sends its own name and is refused before the token is
//     even looked at.
//   - pprof is served only when Config.Pprof is set.

// CookieName is the cookie that carries the token after the first visit.
const CookieName = "tensorlane_dashboard"

// newToken returns 128 random bits in hex.
func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// hostAllowed reports whether a request's Host header names this server
// rather than some other name that happens to resolve to it.
func (h *Handler) hostAllowed(host string) bool {
	if name, _, err := net.SplitHostPort(host); err == nil {
		host = name
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	switch {
	case host == "":
		return false
	case net.ParseIP(host) != nil, strings.EqualFold(host, "localhost"):
		return true
	}
	return slices.ContainsFunc(h.cfg.AllowedHosts, func(a string) bool { return strings.EqualFold(a, host) })
}

// authorized checks the token and, when it came in the URL, stores it in
// the session cookie so the page's own requests carry it.
func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.NoAuth {
		return true
	}
	same := func(s string) bool {
		return s != "" && subtle.ConstantTimeCompare([]byte(s), []byte(h.token)) == 1
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") && same(strings.TrimPrefix(a, "Bearer ")) {
		return true
	}
	if c, err := r.Cookie(CookieName); err == nil && same(c.Value) {
		return true
	}
	if same(r.URL.Query().Get("token")) {
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: h.token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		return true
	}
	return false
}

// ServeHTTP implements http.Handler: the host check, then the token, then
// the page and API.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.hostAllowed(r.Host) {
		h.log.Warn("dashboard: refused a request for another host name (DNS rebinding?)", "host", r.Host, "remote", r.RemoteAddr)
		http.Error(w, "dashboard: host not allowed; add it to the dashboard's allowed hosts", http.StatusMisdirectedRequest)
		return
	}
	if !h.authorized(w, r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tensorlane dashboard"`)
		http.Error(w, "dashboard: open the URL with ?token= that the dashboard printed, or send Authorization: Bearer <token>", http.StatusUnauthorized)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Token is the access token requests must present (see Config.Token).
func (h *Handler) Token() string { return h.token }
