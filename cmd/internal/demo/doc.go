// Package demo is the engine of `tensorlane demo` and of the dashboard's
// demo traffic: RL-style weight sync on a simulated cluster built in this
// process (one runtime per host of a topology preset, talking over
// loopback). A trainer puts bf16 weight tensors with a known pattern on its
// simulated GPU and reader actors on other GPUs and hosts Get them (Run),
// or reserve flow-controlled slots that the trainer broadcasts each step's
// weights to along a pipelined tree (RunBroadcast). Every byte is verified
// and every figure comes with the memcpy baseline measured in the same run.
// Devices are simulated: memfd-backed arenas, with real copies.
package demo
