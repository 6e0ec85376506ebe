// Package soak is the engine of `tensorlane soak`: several runtimes in one
// process (simulated dgx-h100 hosts talking over loopback) move random
// tensors between each other, one in eight a broadcast to reserved slots,
// and every byte is checked, while a fault injector kills and restarts
// runtimes under the same identity and addresses, cuts, blackholes and
// delays their data connections (through TCP proxies the readers are routed
// over, faultproxy.go) and presents forged refs.
//
// Run returns a Result whose first six fields are the contract: nothing may
// hang, corrupt or leak, and every error must be typed (named by
// worker.ErrorCode). Print writes it as the command shows it.
package soak
