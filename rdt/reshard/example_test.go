package reshard_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/reshard"
)

// A weight of 8 x 6 bf16 held as FSDP rows by two trainers, needed as
// tensor-parallel columns by three readers: each reader gets its two
// columns of every row from both trainers, four rows of 4 bytes from each.
func Example() {
	from, _ := reshard.Split([]int64{8, 6}, 2, 0, 2)
	to, _ := reshard.Split([]int64{8, 6}, 2, 1, 3)
	p, _ := reshard.NewPlan(from, to)
	fmt.Print(p.Explain())
	// Output:
	// reshard [8 6] (2-byte elements): 2 source shards -> 3 destination shards, 6 moves, 96 bytes
	// destination 0 [0:8, 0:2] (32 bytes)
	//   <- source 0 [0:4, 0:6]: block [0:4, 0:2], 16 bytes in 4 ranges of 4 bytes
	//   <- source 1 [4:8, 0:6]: block [4:8, 0:2], 16 bytes in 4 ranges of 4 bytes
	// destination 1 [0:8, 2:4] (32 bytes)
	//   <- source 0 [0:4, 0:6]: block [0:4, 2:4], 16 bytes in 4 ranges of 4 bytes
	//   <- source 1 [4:8, 0:6]: block [4:8, 2:4], 16 bytes in 4 ranges of 4 bytes
	// destination 2 [0:8, 4:6] (32 bytes)
	//   <- source 0 [0:4, 0:6]: block [0:4, 4:6], 16 bytes in 4 ranges of 4 bytes
	//   <- source 1 [4:8, 0:6]: block [4:8, 4:6], 16 bytes in 4 ranges of 4 bytes
}

// The runs a trainer's move is pushed as (Sender made with NewSenderOver):
// trainer 1 holds rows 4..7 of the 8 x 6 bf16 weight (12-byte rows in its
// memory), reader 2 needs columns 4..5, the last 4 bytes of each row.
func ExampleMove_SrcRuns() {
	from, _ := reshard.Split([]int64{8, 6}, 2, 0, 2)
	to, _ := reshard.Split([]int64{8, 6}, 2, 1, 3)
	p, _ := reshard.NewPlan(from, to)
	for _, m := range p.Into(2) {
		if m.Src == 1 {
			fmt.Println(m.SrcRuns())
		}
	}
	// Output:
	// [{8 4} {20 4} {32 4} {44 4}]
}
