package archtest_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/internal/archtest"
)

func ExampleCheck() {
	for _, v := range archtest.Check([]archtest.Package{
		{Path: "sched", Imports: []string{"topology"}, Doc: "Package sched places actors."},
		{Path: "topology", Imports: []string{"rdt"}, Doc: "Package topology models hardware."},
	}) {
		fmt.Println(v)
	}
	// Output: topology imports rdt: topology must not import rdt (the hardware model sits at the bottom: fabric and sched read it)
}
