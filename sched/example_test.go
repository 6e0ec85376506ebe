package sched_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/topology"
)

func Example() {
	// Two GB200 NVL72 racks (36 trays of 4 GPUs).
	cluster, err := topology.PresetCluster("gb200-nvl72", 36, 0)
	if err != nil {
		panic(err)
	}
	s, err := sched.New(cluster, sched.Config{})
	if err != nil {
		panic(err)
	}
	req, err := sched.ParseRequest([]byte(`{
		"strategy": "PACK",
		"bundles": [{"kind": "gpu", "devices": 4}, {"kind": "gpu", "devices": 4}],
		"topology": {"required": "nvlink-domain"},
		"traffic": [{"from": 0, "to": 1, "gbps": 800}]}`))
	if err != nil {
		panic(err)
	}
	p, err := s.Reserve("trainer", req)
	if err != nil {
		panic(err)
	}
	for _, a := range p.Assignments {
		fmt.Printf("bundle %d -> %s %v\n", a.Bundle, a.Host, a.Devices)
	}
	fmt.Printf("span %s %s, %.4f s per step\n", p.Span, p.Group, p.EstimatedSeconds)

	// 80 GPUs never fit one NVLink domain of 72.
	big := sched.Request{Topology: sched.Topology{Required: sched.LevelNVLinkDomain}}
	for i := 0; i < 20; i++ {
		big.Bundles = append(big.Bundles, sched.Bundle{Kind: topology.KindGPU, Devices: 4})
	}
	p, err = s.Place(big)
	fmt.Println(p.Feasible, p.Reasons)
	// Output:
	// bundle 0 -> h0 [0 1 2 3]
	// bundle 1 -> h1 [0 1 2 3]
	// span nvlink-domain nvl72-0, 0.0278 s per step
	// false [needs 80 GPUs in one NVLink domain; the largest free has 72]
}
