package dashboard_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/tensorlane/tensorlane/dashboard"
	"github.com/tensorlane/tensorlane/topology"
)

// A worker mounts the dashboard in its own server; here it only draws a
// preset's topology (with runtimes in Config.Runtimes it also shows their
// transfers, objects and memory). Every request presents the handler's
// token; a person opens the page at /?token=<token>.
func Example() {
	cl, _ := topology.Preset("dgx-h100", 2)
	h, err := dashboard.New(dashboard.Config{Cluster: cl})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(h) // or http.Handle("/", h) in your server
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/api/topology.svg", nil)
	req.Header.Set("Authorization", "Bearer "+h.Token())
	resp, err := srv.Client().Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	svg, _ := io.ReadAll(resp.Body)
	fmt.Println("GPUs drawn:", strings.Count(string(svg), `class="device gpu`))
	// Output: GPUs drawn: 16
}
